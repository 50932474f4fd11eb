// Package metrics serves gpuhost's Prometheus endpoint, GET /metrics.
//
// It exports two families of series:
//
//   - GPU gauges under the names, HELP texts and labels of NVIDIA's
//     dcgm-exporter default set (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED,
//     …; labels gpu, UUID, device, modelName, Hostname), so that the
//     Grafana dashboards people already run against dcgm-exporter work on a
//     gpuhost box without a DCGM install. They are read from the NVML
//     snapshot at scrape time: there is no background polling, so a value is
//     never older than the scrape that shows it.
//   - gpuhost's own: the active profile, the Supervisor's phase, switch
//     counts and durations (from the Supervisor's events), the /v1 proxy's
//     requests, tokens and latencies (ObserveRequest) and its hold times
//     and decode rates (ObserveRequestDetail), the doctor's checks
//     (run in the background, served from a cache) and the backend units'
//     states.
//
// The endpoint has its own registry, not Prometheus's global one, so that
// nothing another package registers by accident shows up on it and tests can
// build as many as they like.
package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"gpuhost/api"
	"gpuhost/internal/apishape"
)

// Supervisor is what the metrics read from the daemon core;
// *appliance.Supervisor satisfies it. Only public, copying methods are used:
// Status takes the Supervisor's state lock just long enough to copy the
// state and does its GPU and unit reads outside it, so a scrape can never
// hold up a switch, nor a switch a scrape.
type Supervisor interface {
	// Status returns the state, the GPU snapshot (or why there is none),
	// the backend units and the profiles.
	Status(ctx context.Context) api.Status
	// Subscribe streams the Supervisor's events after seq since, with the
	// ones still buffered as a backlog.
	Subscribe(since uint64) (<-chan api.Event, []api.Event, func())
}

// Defaults of the timing knobs. They are fields of Metrics (not constants)
// only so that tests can shorten them; New sets these values.
const (
	// DefaultScrapeTimeout bounds the GPU and unit reads of one scrape. It
	// is well under Prometheus's default scrape_timeout (10 s), so a hung
	// driver yields gpuhost_gpu_up 0 rather than a failed scrape.
	DefaultScrapeTimeout = 4 * time.Second
	// DefaultDoctorInterval is how often the doctor runs in the background.
	DefaultDoctorInterval = 60 * time.Second
	// DefaultDoctorMinInterval is the least time between two doctor runs
	// when one is asked for early (by a scrape that finds the cache stale,
	// or by the end of a switch): the doctor probes the backend over HTTP
	// and reads /proc, which is not free.
	DefaultDoctorMinInterval = 30 * time.Second
	// doctorRunTimeout bounds one doctor run.
	doctorRunTimeout = 45 * time.Second
	// maxModels bounds the distinct values of the proxy's model label: the
	// model name comes from clients, and unbounded label values would grow
	// Prometheus's memory without limit.
	maxModels = 32
)

// Metrics owns the /metrics registry and the state behind the series that are
// not read at scrape time (event-fed counters, the doctor cache). Make one
// with New, start Run, and mount it with Register.
type Metrics struct {
	sup      Supervisor
	doctor   api.DoctorFunc
	log      *slog.Logger
	reg      *prometheus.Registry
	hostname string
	models   *boundedLabel

	scrapeTimeout     time.Duration
	doctorInterval    time.Duration
	doctorMinInterval time.Duration

	switches    *prometheus.CounterVec
	switchDur   *prometheus.HistogramVec
	stepDur     *prometheus.HistogramVec
	wakeFails   *prometheus.CounterVec
	drift       *prometheus.CounterVec
	crashes     *prometheus.CounterVec
	eventsLost  prometheus.Counter
	proxyReqs   *prometheus.CounterVec
	proxyTokens *prometheus.CounterVec
	proxyTTFB   *prometheus.HistogramVec
	proxyDur    *prometheus.HistogramVec
	proxyHold   *prometheus.HistogramVec
	proxyTokPS  *prometheus.HistogramVec

	// doctorReq asks the doctor loop for an early run (buffered, 1).
	doctorReq chan struct{}

	mu sync.Mutex
	// started are the switches in flight by id: one per lane (GPU set) at
	// most, so a start whose end event was lost is forgotten once more
	// than maxInFlightSwitches run.
	started  map[string]time.Time
	lastSeq  uint64
	progress chan struct{} // closed and replaced after each event and doctor run
	report   *api.DoctorReport
	reportAt time.Time
	runs     uint64 // doctor runs finished
}

// New builds the metrics for sup, which scrapes and Run read. doctor may be
// nil (no doctor series). Everything is registered on a private registry;
// nothing runs until Run, and ObserveRequest works without Run.
func New(sup Supervisor, doctor api.DoctorFunc, log *slog.Logger) *Metrics {
	if log == nil {
		log = slog.Default()
	}
	host, err := os.Hostname()
	if err != nil {
		// dcgm-exporter leaves the label out when it has no hostname;
		// an empty value is the same thing to Prometheus.
		log.Warn("metrics: no hostname for the DCGM Hostname label", "err", err)
		host = ""
	}
	m := &Metrics{
		sup:               sup,
		doctor:            doctor,
		log:               log,
		reg:               prometheus.NewRegistry(),
		hostname:          host,
		models:            newBoundedLabel(maxModels),
		scrapeTimeout:     DefaultScrapeTimeout,
		doctorInterval:    DefaultDoctorInterval,
		doctorMinInterval: DefaultDoctorMinInterval,
		doctorReq:         make(chan struct{}, 1),
		progress:          make(chan struct{}),

		switches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_switches_total",
			Help: "Profile switches finished, by target profile and result (done or failed; a failed switch that rolled back counts as failed).",
		}, []string{"profile", "result"}),
		switchDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuhost_switch_duration_seconds",
			Help:    "Wall time of finished profile switches, from request to the new backend verified (or to the failure), by target profile and result.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 600},
		}, []string{"profile", "result"}),
		stepDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuhost_switch_step_duration_seconds",
			Help:    "Wall time of the switch steps that succeeded (drain, stop, vram_release, configure, start, ready, load_model, verify, wake_check; rollback.* during a rollback).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"step"}),
		wakeFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_wake_failures_total",
			Help: "Verified-wake checks that failed, by reason (hang, output, rate, tools, ready): after a wake the unit is restarted cold.",
		}, []string{"reason"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_backend_drift_total",
			Help: "Backend changes made behind gpuhost's back that the watcher found, by kind (asleep, foreign_model, stray_unit, standby_awake, several_active, verify_failed).",
		}, []string{"kind"}),
		crashes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_backend_crashes_total",
			Help: "Backend units that left active without gpuhost asking (the active one, or one in standby), by profile and reason (systemd's result: exit-code, signal, core-dump, oom-kill, …; start-failed for a restart that did not come up).",
		}, []string{"profile", "reason"}),
		eventsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuhost_metrics_events_lost_total",
			Help: "Supervisor events the metrics missed because their subscription fell behind; switch counts may be low by as much.",
		}),
		proxyReqs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_proxy_requests_total",
			Help: "Requests answered by the /v1 proxy, by API (chat, completions, embeddings, messages, count_tokens, responses, other), model and HTTP status code.",
		}, []string{"api", "model", "code"}),
		proxyTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_proxy_tokens_total",
			Help: "Tokens reported by the backends through the /v1 proxy, by API (chat, completions, embeddings, messages, count_tokens, responses, other), model and kind (prompt or completion).",
		}, []string{"api", "model", "kind"}),
		proxyTTFB: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuhost_proxy_time_to_first_byte_seconds",
			Help:    "Time from a /v1 request's arrival to the first response byte sent to the client, including any hold during a switch, by model.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"model"}),
		proxyDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuhost_proxy_request_duration_seconds",
			Help:    "Time from a /v1 request's arrival to the end of its response, by model.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"model"}),
		proxyHold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuhost_proxy_hold_seconds",
			Help:    "Time a /v1 request was held waiting for a switch (requests not held are not observed), by model.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600},
		}, []string{"model"}),
		proxyTokPS: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuhost_proxy_output_tokens_per_second",
			Help:    "Decode rate of streamed /v1 answers: completion tokens after the first over the time from the first to the last byte, by model (non-streamed answers are not observed).",
			Buckets: []float64{1, 2, 5, 10, 15, 20, 30, 40, 50, 75, 100, 150, 200, 300, 500, 1000},
		}, []string{"model"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&scrapeCollector{m: m},
		m.switches, m.switchDur, m.stepDur, m.eventsLost, m.wakeFails, m.drift, m.crashes,
		m.proxyReqs, m.proxyTokens, m.proxyTTFB, m.proxyDur, m.proxyHold, m.proxyTokPS,
	)
	return m
}

// crashReasons are the results systemd gives a unit that left active on
// its own, and start-failed for a restart that did not come up.
var crashReasons = []string{"exit-code", "signal", "core-dump", "oom-kill", "watchdog", "timeout", "start-limit-hit", "start-failed"}

// zeroCrashes exports gpuhost_backend_crashes_total at 0 for every profile
// and reason before any crash: Prometheus's increase() cannot count the
// first crash of a series that appears already at 1, and an alert on it
// would stay silent.
func (m *Metrics) zeroCrashes(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, m.scrapeTimeout)
	defer cancel()
	for _, p := range m.sup.Status(sctx).Profiles {
		for _, r := range crashReasons {
			m.crashes.WithLabelValues(cleanLabel(p.Name), r)
		}
	}
}

// Register mounts GET /metrics on e. Errors of single collectors are logged
// and the rest is served (ContinueOnError): a scrape that loses one family is
// better than a scrape that loses all of them.
func (m *Metrics) Register(e *echo.Echo) {
	e.GET("/metrics", echo.WrapHandler(m.Handler()))
}

// Add registers the collectors of a co-hosted service (the triage
// worker's mail and cost counters) on the same /metrics, so one scrape sees
// the whole box. A collector that clashes with an existing name is an error.
func (m *Metrics) Add(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return fmt.Errorf("register metrics collector: %w", err)
		}
	}
	return nil
}

// Handler is the /metrics handler without echo, for callers that mount it
// elsewhere. It adds promhttp's own request and error counters.
func (m *Metrics) Handler() http.Handler {
	return promhttp.InstrumentMetricHandler(m.reg, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      slogPrintln{m.log},
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.reg,
	}))
}

// slogPrintln adapts slog to promhttp's Println-style error log.
type slogPrintln struct{ log *slog.Logger }

func (l slogPrintln) Println(v ...any) {
	l.log.Error("metrics: serving /metrics", "err", fmt.Sprint(v...))
}

// Run follows the Supervisor's events and runs the doctor loop until ctx
// ends; start it in its own goroutine. It subscribes from sequence 0, so the
// switches still in the Supervisor's event buffer (such as the restore at
// start-up) are counted even when Run starts after them.
func (m *Metrics) Run(ctx context.Context) {
	m.zeroCrashes(ctx)
	ch, backlog, cancel := m.sup.Subscribe(0)
	defer cancel()
	var wg sync.WaitGroup
	if m.doctor != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.doctorLoop(ctx)
		}()
	}
	defer wg.Wait()
	if len(backlog) > 0 {
		// The ring may have dropped older events: that is history, not a
		// loss of ours, so the gap count starts at the backlog.
		m.mu.Lock()
		m.lastSeq = backlog[0].Seq - 1
		m.mu.Unlock()
	}
	for _, e := range backlog {
		m.handle(e)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-ch:
			if !ok {
				return
			}
			m.handle(e)
		}
	}
}

// ObserveRequest records one request answered by the /v1 proxy: the API it
// spoke (its Label: a fixed few values), the model it asked for, the HTTP
// status sent, the token counts the backend reported
// (0 when unknown), the time to the first response byte (0 or less: no byte
// was sent, not observed) and the whole duration. model comes from the
// client, so it is cleaned (valid UTF-8, at most 128 bytes) and, past 32
// distinct values, reported as "other". It never blocks on the Supervisor.
func (m *Metrics) ObserveRequest(api apishape.Kind, model string, status int, promptTokens, completionTokens int, ttfb, dur time.Duration) {
	mdl, apiName := m.models.value(model), api.Label()
	m.proxyReqs.WithLabelValues(apiName, mdl, strconv.Itoa(status)).Inc()
	if promptTokens > 0 {
		m.proxyTokens.WithLabelValues(apiName, mdl, "prompt").Add(float64(promptTokens))
	}
	if completionTokens > 0 {
		m.proxyTokens.WithLabelValues(apiName, mdl, "completion").Add(float64(completionTokens))
	}
	if ttfb > 0 {
		m.proxyTTFB.WithLabelValues(mdl).Observe(ttfb.Seconds())
	}
	m.proxyDur.WithLabelValues(mdl).Observe(max(dur, 0).Seconds())
}

// ObserveRequestDetail records what ObserveRequest does not carry (the
// proxy calls it right after ObserveRequest): the time the request was held
// for a switch, and for a streamed answer with at least two completion
// tokens the decode rate, (completionTokens-1) / (dur-ttfb), since the
// first token arrives at ttfb. model is cleaned and bounded as in
// ObserveRequest.
func (m *Metrics) ObserveRequestDetail(model string, held time.Duration, stream bool, completionTokens int, ttfb, dur time.Duration) {
	if held <= 0 && (!stream || completionTokens < 2 || ttfb <= 0 || dur <= ttfb) {
		return
	}
	mdl := m.models.value(model)
	if held > 0 {
		m.proxyHold.WithLabelValues(mdl).Observe(held.Seconds())
	}
	if stream && completionTokens >= 2 && ttfb > 0 && dur > ttfb {
		m.proxyTokPS.WithLabelValues(mdl).Observe(float64(completionTokens-1) / (dur - ttfb).Seconds())
	}
}
