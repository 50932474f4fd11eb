// Package activity keeps what the panel's Activity page shows, in memory
// and bounded: the last requests the /v1 proxy answered (Log, a ring with
// live subscribers) and an hour of samples of the GPU and of the proxy's
// throughput, with the switches that happened in it (History, sampled
// every 2 s).
//
// Nothing is written to disk: the page is for watching the box now and in
// the last hour, and Prometheus (/metrics) is the long-term record. The
// bounds make the memory fixed: LogSize requests (a few hundred bytes
// each) and Keep/Interval samples.
//
// The log holds only what the proxy decided, never what the client wrote:
// the model is the served name the request resolved to (or ""), the path is
// the cleaned /v1 path, the client is the TCP peer's address (never a
// forwarded-for header); no prompt, no answer, no header, no token.
//
// The package is a leaf: it imports the wire types (api, nvml) and the
// standard library, and takes the GPU and the Supervisor's events through
// the small interfaces GPU and Events.
package activity

import (
	"slices"
	"strconv"
	"sync"
	"time"
)

// DefaultLogSize is how many requests the log keeps when Options.LogSize
// is 0: enough for the page's table and a few minutes of a busy agent.
const DefaultLogSize = 500

// Request is one /v1 request as the proxy finished it.
type Request struct {
	// Seq numbers the log's requests from 1, in the order they were
	// recorded; the live stream resumes after a Seq.
	Seq uint64 `json:"seq"`
	// Time is when the request arrived.
	Time time.Time `json:"time"`
	// Client is the TCP peer's IP address.
	Client string `json:"client"`
	Method string `json:"method"`
	// Path is the cleaned request path (no query).
	Path string `json:"path"`
	// API is which /v1 API the path is: chat, completions, embeddings,
	// messages (Anthropic), count_tokens, responses (OpenAI); "" for others.
	API string `json:"api,omitempty"`
	// Model is the served name the request was routed to, "" when it was
	// answered before routing (a bad body, no backend).
	Model   string `json:"model"`
	Profile string `json:"profile,omitempty"`
	// Status is what the request ended with: the HTTP status sent, 499 when
	// the client left first, 502 when the backend broke off the answer.
	Status           int  `json:"status"`
	Stream           bool `json:"stream"`
	PromptTokens     int  `json:"prompt_tokens"`
	CompletionTokens int  `json:"completion_tokens"`
	// TTFB is the time to the first byte sent (for a stream, the first
	// token); 0 when nothing was sent.
	TTFB     time.Duration `json:"ttfb_ns"`
	Duration time.Duration `json:"duration_ns"`
	// Held is the time the request waited for a switch (or the auto-switch
	// policy) before it was forwarded.
	Held     time.Duration `json:"held_ns"`
	Switched bool          `json:"switched,omitempty"`
}

// TokensPerSecond is the request's output rate: for a stream with at least
// two completion tokens the decode rate (the first token arrives at TTFB,
// so (tokens-1) over the rest), as the gpuhost_proxy_decode_tokens_per_second
// metric measures it; otherwise the completion tokens over the whole
// duration. 0 when no tokens were reported.
func (r Request) TokensPerSecond() float64 {
	switch {
	case r.CompletionTokens <= 0 || r.Duration <= 0:
		return 0
	case r.Stream && r.CompletionTokens >= 2 && r.TTFB > 0 && r.Duration > r.TTFB:
		return float64(r.CompletionTokens-1) / (r.Duration - r.TTFB).Seconds()
	}
	return float64(r.CompletionTokens) / r.Duration.Seconds()
}

// Filter selects requests: by served model ("" any) and by status ("" any;
// "ok" below 400, "error" 400 and above, "2xx", "4xx", "5xx", or one code
// like "503").
type Filter struct {
	Model  string
	Status string
}

// ValidStatus reports whether s is a status filter Match understands.
func ValidStatus(s string) bool {
	switch s {
	case "", "ok", "error", "2xx", "3xx", "4xx", "5xx":
		return true
	}
	n, err := strconv.Atoi(s)
	return err == nil && len(s) == 3 && n >= 100 && n <= 599
}

// Match reports whether r passes the filter. An invalid status filter
// matches nothing.
func (f Filter) Match(r Request) bool {
	if f.Model != "" && r.Model != f.Model {
		return false
	}
	switch s := f.Status; s {
	case "":
		return true
	case "ok":
		return r.Status < 400
	case "error":
		return r.Status >= 400
	case "2xx", "3xx", "4xx", "5xx":
		return r.Status/100 == int(s[0]-'0')
	default:
		return ValidStatus(s) && strconv.Itoa(r.Status) == s
	}
}

// Totals are the log's running counts since it was made (they do not
// shrink when the ring drops old entries): the history's request and
// token rates are their differences between two samples.
type Totals struct {
	Requests         uint64
	PromptTokens     uint64
	CompletionTokens uint64
}

// Log is a bounded ring of the last requests with live subscribers. Record
// never blocks: a subscriber is only told "there is more" (a channel of
// one that coalesces), and reads what is new with After; one that falls
// further behind than the ring loses the oldest (After says how many).
type Log struct {
	mu     sync.Mutex
	ring   []Request // len = capacity once full
	next   int       // where the next entry goes once full
	seq    uint64
	totals Totals
	subs   map[chan struct{}]struct{}
}

// NewLog returns a log that keeps the last size requests (DefaultLogSize
// for 0 or less).
func NewLog(size int) *Log {
	if size <= 0 {
		size = DefaultLogSize
	}
	return &Log{ring: make([]Request, 0, size), subs: map[chan struct{}]struct{}{}}
}

// Size is how many requests the log keeps.
func (l *Log) Size() int { return cap(l.ring) }

// Record adds r (its Seq is assigned here) and tells the subscribers. The
// proxy calls it once per request, from the request's goroutine.
func (l *Log) Record(r Request) {
	l.mu.Lock()
	l.seq++
	r.Seq = l.seq
	if len(l.ring) < cap(l.ring) {
		l.ring = append(l.ring, r)
	} else {
		l.ring[l.next] = r
		l.next = (l.next + 1) % cap(l.ring)
	}
	l.totals.Requests++
	l.totals.PromptTokens += uint64(max(r.PromptTokens, 0))
	l.totals.CompletionTokens += uint64(max(r.CompletionTokens, 0))
	for ch := range l.subs {
		select {
		case ch <- struct{}{}:
		default: // already told, not yet read: one wake-up covers both
		}
	}
	l.mu.Unlock()
}

// ordered returns the ring oldest first; l.mu is held.
func (l *Log) ordered() []Request {
	out := make([]Request, 0, len(l.ring))
	out = append(out, l.ring[l.next:]...)
	return append(out, l.ring[:l.next]...)
}

// Recent returns up to limit requests that match f, newest first (limit 0
// or less: all kept).
func (l *Log) Recent(f Filter, limit int) []Request {
	l.mu.Lock()
	all := l.ordered()
	l.mu.Unlock()
	out := []Request{}
	for i := len(all) - 1; i >= 0; i-- {
		if limit > 0 && len(out) >= limit {
			break
		}
		if f.Match(all[i]) {
			out = append(out, all[i])
		}
	}
	return out
}

// After returns the kept requests with a Seq above seq, oldest first, and
// how many after seq the ring no longer holds (a reader that fell behind).
func (l *Log) After(seq uint64) (rs []Request, missed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if seq >= l.seq {
		return nil, 0
	}
	all := l.ordered()
	first := all[0].Seq
	if seq+1 < first {
		missed = first - seq - 1
	}
	i, _ := slices.BinarySearchFunc(all, seq+1, func(r Request, s uint64) int {
		switch {
		case r.Seq < s:
			return -1
		case r.Seq > s:
			return 1
		}
		return 0
	})
	return all[i:], missed
}

// LastSeq is the Seq of the newest request (0: none yet).
func (l *Log) LastSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// Totals returns the running counts.
func (l *Log) Totals() Totals {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.totals
}

// Models returns the served models of the kept requests, sorted, without
// "" (the filter's choices).
func (l *Log) Models() []string {
	l.mu.Lock()
	seen := map[string]bool{}
	for _, r := range l.ring {
		if r.Model != "" {
			seen[r.Model] = true
		}
	}
	l.mu.Unlock()
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Subscribe returns a channel that receives a value after Record (several
// records may share one), and the function that ends the subscription.
func (l *Log) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	l.subs[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs, ch)
		l.mu.Unlock()
	}
}

// Subscribers is how many subscriptions are open (for tests and the log).
func (l *Log) Subscribers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.subs)
}
