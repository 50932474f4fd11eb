package triage

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the worker's Prometheus series; the daemon registers them on
// its /metrics registry through Collectors.
type metrics struct {
	mails        *prometheus.CounterVec
	cost         *prometheus.CounterVec
	tokens       *prometheus.CounterVec
	audioSeconds prometheus.Counter
	energyWh     prometheus.Counter
	pollFailures prometheus.Counter
	consecutive  prometheus.Gauge
	checks       *prometheus.CounterVec
	postErrors   *prometheus.CounterVec
	problems     prometheus.Counter
	checkpoint   prometheus.Gauge
}

func newMetrics(currency string) *metrics {
	cur := prometheus.Labels{"currency": currency}
	return &metrics{
		mails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_triage_mails_total",
			Help: "Mails posted by the triage worker, by class (customer, prospect, lead, promotional, other, unclassified).",
		}, []string{"class"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "gpuhost_triage_cost_total",
			Help:        "AI cost of triaged mails in the configured currency, by kind (classification, transcription, energy).",
			ConstLabels: cur,
		}, []string{"kind"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_triage_tokens_total",
			Help: "Model tokens used for classification, by kind (prompt, completion).",
		}, []string{"kind"}),
		audioSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuhost_triage_audio_seconds_total",
			Help: "Seconds of voice memo audio transcribed.",
		}),
		energyWh: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuhost_triage_energy_wh_total",
			Help: "GPU energy of local model calls for triage (NVML power × call duration), in watt-hours.",
		}),
		pollFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuhost_triage_poll_failures_total",
			Help: "Polls that failed (fetch, model endpoint, sink or checkpoint); the mail is retried on the next poll.",
		}),
		consecutive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuhost_triage_consecutive_poll_failures",
			Help: "Failed polls in a row now; the alert goes out at triage.alerting.failures_before_alert.",
		}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_triage_sink_checks_total",
			Help: "After a crash, checks whether a sink already had an in-flight post, by sink and answer.",
		}, []string{"sink", "posted"}),
		postErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_triage_post_errors_total",
			Help: "Posts a sink refused or could not take; the mail is retried.",
		}, []string{"sink"}),
		problems: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuhost_triage_mail_problems_total",
			Help: "Problems noted on triaged mails (broken MIME, unknown charset, failed transcription or CRM lookup, oversized mail).",
		}),
		checkpoint: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuhost_triage_checkpoint_uid",
			Help: "Highest mailbox UID fully processed.",
		}),
	}
}

// observe counts what one judged mail cost (dry runs included: the model
// was paid either way). Mails are counted when posted.
func (m *metrics) observe(r *Result) {
	c := r.Cost
	add(m.cost.WithLabelValues("classification"), c.Classification)
	add(m.cost.WithLabelValues("transcription"), c.Transcription)
	add(m.cost.WithLabelValues("energy"), c.Energy)
	add(m.tokens.WithLabelValues("prompt"), float64(c.PromptTokens))
	add(m.tokens.WithLabelValues("completion"), float64(c.CompletionTokens))
	add(m.audioSeconds, c.AudioSeconds)
	add(m.energyWh, c.EnergyWh)
	add(m.problems, float64(len(r.Problems)))
}

// add skips what a counter must not take: Prometheus panics on a negative
// Add, and a negative price in the config must not stop the worker.
func add(c prometheus.Counter, v float64) {
	if v > 0 {
		c.Add(v)
	}
}

// Collectors are the worker's Prometheus series, for the daemon's /metrics
// registry (the worker registers nothing itself, so two workers in one test
// process never collide).
func (w *Worker) Collectors() []prometheus.Collector {
	m := w.metrics
	return []prometheus.Collector{
		m.mails, m.cost, m.tokens, m.audioSeconds, m.energyWh, m.pollFailures,
		m.consecutive, m.checks, m.postErrors, m.problems, m.checkpoint,
	}
}
