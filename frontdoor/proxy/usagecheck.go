package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"gpuhost/internal/apishape"
	"gpuhost/units"
)

// Usage comes from the backend, which is a separate process gpuhost does
// not trust for arithmetic: a count of 2^63-1 wrapped
// gpuhost_proxy_tokens_total (a float64 counter loses small increments
// above 2^53), negative counts reached the log, and the Activity page
// showed 1e23 tokens/s. So a request's usage is counted only when it is
// sane; otherwise the request counts no tokens and the refusal is counted
// on gpuhost_proxy_usage_refused_total{reason}:
//
//   - negative: a count below zero;
//   - too_large: a count above usageCeiling (more than any request can
//     hold: a body of proxy.max_body_bytes has fewer tokens than bytes),
//     or, for chat, Messages and Responses, a prompt above the profile's
//     vLLM max_model_len or a completion above it times the choices;
//   - over_max_tokens: a completion above the request's own max_tokens
//     (max_completion_tokens, max_output_tokens) times its choices (n);
//   - after_end: usage sent after the stream's final event ([DONE],
//     message_stop, response.completed); it is ignored and the usage
//     before it counts.

// usageCeiling bounds every count of one request: 2^26 tokens. It keeps
// sums far from overflow and every counter increment exact.
const usageCeiling = 1 << 26

func newUsageRefusedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhost_proxy_usage_refused_total",
		Help: "Backend usage reports on /v1 not counted, by reason (negative, too_large, over_max_tokens, after_end).",
	}, []string{"reason"})
}

// saneCounts reports why counts read from a backend are not usable ("" if
// they are): each must be in 0..usageCeiling. The tap checks each field
// before it adds any up.
func saneCounts(counts ...int) string {
	for _, n := range counts {
		switch {
		case n < 0:
			return "negative"
		case n > usageCeiling:
			return "too_large"
		}
	}
	return ""
}

// takeCounts records whether counts are sane on the tap; false means the
// caller must not use them.
func (t *usageTap) takeCounts(counts ...*int) bool {
	for _, c := range counts {
		if r := saneCounts(deref(c)); r != "" {
			t.bad = r
			return false
		}
	}
	return true
}

// usageLimits are what one request's usage may reach.
type usageLimits struct {
	maxTokens int64 // the request's own output limit, 0: none
	choices   int64 // its "n", 0: one
	context   int64 // the profile's context, 0: unknown
}

// limitsFor: the request's limits and, for a vLLM profile with
// max_model_len (which vLLM enforces), the context. Ollama's context may
// be raised per request, so it bounds nothing here.
func limitsFor(f modelField, prof *units.Profile) usageLimits {
	l := usageLimits{maxTokens: f.MaxTokens, choices: f.Choices}
	if prof != nil && prof.Backend == units.VLLM && prof.VLLM.MaxModelLen > 0 {
		l.context = int64(prof.VLLM.MaxModelLen)
	}
	return l
}

// check reports why prompt and completion break the request's limits ("" if
// they do not). Only the APIs with one prompt and one output limit per
// choice are bounded by them: completions and embeddings take batches.
func (l usageLimits) check(kind apishape.Kind, prompt, compl int) string {
	if r := saneCounts(prompt, compl); r != "" {
		return r
	}
	switch kind {
	case apishape.Chat, apishape.Messages, apishape.Responses:
	default:
		return ""
	}
	n := max(l.choices, 1)
	if l.maxTokens > 0 && int64(compl) > l.maxTokens*min(n, usageCeiling) {
		return "over_max_tokens"
	}
	if l.context > 0 && (int64(prompt) > l.context || int64(compl) > l.context*min(n, usageCeiling)) {
		return "too_large"
	}
	return ""
}

// countedUsage is the usage a finished request counts, after the checks
// above; refused reports are counted on the metric and named in refused
// for the access log.
func (p *Proxy) countedUsage(rec *record) (prompt, compl int, refused string) {
	t := rec.tap
	if t == nil {
		return 0, 0, ""
	}
	if t.late {
		p.usageRefused.WithLabelValues("after_end").Inc()
		refused = "after_end"
	}
	if t.bad != "" {
		p.usageRefused.WithLabelValues(t.bad).Inc()
		return 0, 0, t.bad
	}
	if !t.haveUsage {
		return 0, 0, refused
	}
	if r := rec.limits.check(rec.api, t.prompt, t.compl); r != "" {
		p.usageRefused.WithLabelValues(r).Inc()
		return 0, 0, r
	}
	return t.prompt, t.compl, refused
}
