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
// while a switch holds them could take the daemon's memory. What counts is
// the capacity of the buffers that hold them (see readBudgeted): counting
// bytes read let a doubling buffer hold ~1.7× the budget.
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

// firstChunk is the buffer a body of unannounced length starts with; it
// doubles from there.
const firstChunk = 32 << 10

// readBudgeted reads r whole (at most limit+1 bytes, so the caller can
// tell a body over limit) and counts the buffers' capacity, not the bytes
// read, against b: what the daemon holds is the buffer. An announced length
// (> 0) is reserved and allocated once, exactly; an unannounced one grows
// by doubling, each new buffer reserved before it is allocated (the old one
// is still held during the copy) and the old one given back after.
// reserved is what the caller gives back when the body is no longer
// needed, also after an error.
func readBudgeted(r io.Reader, b *memBudget, announced, limit int64) (body []byte, reserved int64, err error) {
	size := int64(firstChunk)
	if announced > 0 {
		size = announced
	}
	size = min(size, limit+1)
	if !b.take(size) {
		return nil, 0, errOverBudget
	}
	reserved = size
	buf := make([]byte, 0, size)
	lr := io.LimitReader(r, limit+1)
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) > limit {
				return buf, reserved, nil // over limit: the caller refuses it
			}
			// A full buffer grows only when more than it holds arrives
			// (a body of exactly the announced length never does).
			var one [1]byte
			n, rerr := io.ReadFull(lr, one[:])
			if n == 0 {
				if rerr == io.EOF {
					return buf, reserved, nil
				}
				return nil, reserved, rerr
			}
			next := min(2*int64(cap(buf)), limit+1)
			if !b.take(next) {
				return nil, reserved, errOverBudget
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			b.give(reserved)
			buf, reserved = append(grown, one[0]), next
		}
		n, rerr := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if rerr == io.EOF {
			return buf, reserved, nil
		}
		if rerr != nil {
			return nil, reserved, rerr
		}
	}
}

func overBudget(limit int64) *apiErr {
	return &apiErr{status: 503, typ: "service_unavailable", code: "body_memory_exhausted", retryAfter: true,
		msg: "the proxy holds as many request bodies as proxy.body_memory_bytes (" + strconv.FormatInt(limit, 10) + " bytes) allows; retry shortly"}
}

// Collectors are the proxy's own series for the daemon's /metrics.
func (p *Proxy) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.rejected, p.usageRefused, p.deferred, p.drainTimeouts, p.switchEnds}
}

func newRejectedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhost_proxy_rejected_total",
		Help: "Requests on /v1 refused before routing, by reason (body_memory: proxy.body_memory_bytes was used up).",
	}, []string{"reason"})
}
