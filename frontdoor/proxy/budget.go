package proxy

import (
	"errors"
	"io"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// memBudget bounds the memory that request bodies take in the proxy at
// once. Bodies are read whole (to route on "model" and to hold a request
// during a switch), so without a bound a few clients sending large bodies
// while a switch holds them could take the daemon's memory. A body whose
// length is announced reserves it before a byte is read; a chunked body
// reserves as it arrives.
type memBudget struct {
	mu    sync.Mutex
	used  int64
	limit int64
}

// take reserves n bytes; false when they do not fit.
func (b *memBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit-b.used {
		return false
	}
	b.used += n
	return true
}

func (b *memBudget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

var errOverBudget = errors.New("the proxy's body memory budget is used up")

// budgetReader reserves every chunk it reads beyond what was reserved up
// front; reserved is what the request holds when it ends.
type budgetReader struct {
	r        io.Reader
	b        *memBudget
	prepaid  int64 // reserved before reading (the announced length)
	read     int64
	reserved int64
}

func (br *budgetReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	br.read += int64(n)
	if extra := br.read - br.reserved; extra > 0 {
		if !br.b.take(extra) {
			return n, errOverBudget
		}
		br.reserved += extra
	}
	return n, err
}

func overBudget(limit int64) *apiErr {
	return &apiErr{status: 503, typ: "service_unavailable", code: "body_memory_exhausted", retryAfter: true,
		msg: "the proxy holds as many request bodies as proxy.body_memory_bytes (" + strconv.FormatInt(limit, 10) + " bytes) allows; retry shortly"}
}

// Collectors are the proxy's own series for the daemon's /metrics.
func (p *Proxy) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.rejected, p.deferred, p.drainTimeouts}
}

func newRejectedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhost_proxy_rejected_total",
		Help: "Requests on /v1 refused before routing, by reason (body_memory: proxy.body_memory_bytes was used up).",
	}, []string{"reason"})
}
