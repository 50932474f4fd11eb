package proxy

import (
	"strconv"

	"gpuhost/internal/membudget"

	"github.com/prometheus/client_golang/prometheus"
)

// The proxy's request bodies are held under proxy.body_memory_bytes, a
// budget of the daemon's one kind (internal/membudget): bodies are read
// whole (to route on "model" and to hold a request during a switch), so
// without a bound a few clients sending large bodies while a switch holds
// them could take the daemon's memory.
var (
	readBudgeted  = membudget.Read
	errOverBudget = membudget.ErrOver
)

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
