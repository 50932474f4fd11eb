package mcp

import (
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"

	"gpuhost/internal/redactlog"
	"gpuhost/mcp/connector"
)

// scrubber replaces every secret the Secrets handed out, in the forms a
// connector or a third-party API is likely to echo it: plain, URL-escaped
// (query and path), JSON-escaped and base64 (standard and URL alphabets,
// padded or not, and the aligned interior of a secret embedded in a longer
// base64 string such as a Basic auth header). The replacer is rebuilt only
// when the set of secrets grows, because it does on every new Get.
type scrubber struct {
	secrets *connector.Secrets

	mu   sync.Mutex
	n    int
	repl *strings.Replacer
}

func newScrubber(s *connector.Secrets) *scrubber { return &scrubber{secrets: s} }

// Scrub returns text with every known secret form replaced by connector.Redacted.
func (sc *scrubber) Scrub(text string) string {
	if sc == nil || sc.secrets == nil || text == "" {
		return text
	}
	r := sc.replacer()
	if r == nil {
		return text
	}
	return r.Replace(text)
}

func (sc *scrubber) replacer() *strings.Replacer {
	vals := sc.secrets.Values()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.repl != nil && len(vals) == sc.n {
		return sc.repl
	}
	sc.n = len(vals)
	if len(vals) == 0 {
		sc.repl = nil
		return nil
	}
	seen := map[string]struct{}{}
	for _, v := range vals {
		for _, f := range secretForms(v) {
			if f != "" {
				seen[f] = struct{}{}
			}
		}
	}
	forms := make([]string, 0, len(seen))
	for f := range seen {
		forms = append(forms, f)
	}
	// Longest first: strings.Replacer tries the old strings in argument
	// order at each position, so a secret that contains another secret is
	// replaced whole.
	sort.Slice(forms, func(i, j int) bool {
		if len(forms[i]) != len(forms[j]) {
			return len(forms[i]) > len(forms[j])
		}
		return forms[i] < forms[j]
	})
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, connector.Redacted)
	}
	sc.repl = strings.NewReplacer(pairs...)
	return sc.repl
}

// secretForms lists the encodings of v that are redacted.
func secretForms(v string) []string {
	out := []string{v, url.QueryEscape(v), url.PathEscape(v)}
	if b, err := json.Marshal(v); err == nil { // HTML-escaped, as json.Marshal writes it
		out = append(out, string(b[1:len(b)-1]))
	}
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) == nil {
		b := strings.TrimSpace(buf.String())
		out = append(out, b[1:len(b)-1])
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		out = append(out, enc.EncodeToString([]byte(v)))
	}
	// A secret inside a longer encoded string ("user:secret" in a Basic
	// header) starts at any of three byte alignments; the characters that
	// depend only on the secret's own bytes are the same at each.
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for k := 0; k < 3; k++ {
			full := enc.EncodeToString(append(make([]byte, k), v...))
			lo, hi := (8*k+5)/6, (8*(k+len(v)))/6
			if hi-lo >= 8 && hi <= len(full) {
				out = append(out, full[lo:hi])
			}
		}
	}
	return out
}

// scrubLogger wraps log so everything it writes is scrubbed.
func scrubLogger(log *slog.Logger, sc *scrubber) *slog.Logger {
	return slog.New(redactlog.New(log.Handler(), sc.Scrub))
}
