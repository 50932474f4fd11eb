package simulator

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// vLLM V1's histogram buckets for time to first token and end-to-end latency.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// kvBytesPerToken is the KV cache per token of Qwen3-Coder-30B-A3B in bf16
// (48 layers × 4 KV heads × 128 dims × 2 (K and V) × 2 bytes), the reference
// box's model; the simulated KV cache is a quarter of the claimed VRAM.
const (
	kvBytesPerToken = 96 << 10
	kvBlockSize     = 16
)

type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative
	sum    float64
	count  uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds))}
}

func (h *histogram) observe(v float64) {
	h.sum += v
	h.count++
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
			return
		}
	}
}

// vllmMetrics holds what /metrics reports, named and labelled as vLLM V1 does.
type vllmMetrics struct {
	mu               sync.Mutex
	promptTokens     uint64
	generationTokens uint64
	success          map[string]uint64 // by finished_reason
	ttft             *histogram
	e2e              *histogram
	kvTokens         int64 // tokens held by running sequences
	created          float64
}

func newVLLMMetrics() *vllmMetrics {
	return &vllmMetrics{
		success: map[string]uint64{"stop": 0, "length": 0, "abort": 0},
		ttft:    newHistogram(ttftBuckets),
		e2e:     newHistogram(e2eBuckets),
		created: float64(time.Now().UnixNano()) / 1e9,
	}
}

func (m *vllmMetrics) prefilled(promptTokens int, ttft time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.promptTokens += uint64(promptTokens)
	m.kvTokens += int64(promptTokens)
	m.ttft.observe(ttft.Seconds())
}

func (m *vllmMetrics) generated() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.generationTokens++
	m.kvTokens++
}

// finished records a request leaving the engine; kv is the KV tokens it held.
func (m *vllmMetrics) finished(reason string, kv int, e2e time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.success[reason]++
	m.kvTokens -= int64(kv)
	m.e2e.observe(e2e.Seconds())
}

// metricsView is what the exposition needs besides the counters.
type metricsView struct {
	sleep       *vllmEngine // vllm:engine_sleep_state; nil: left out
	modelName   string
	running     int64
	waiting     int64
	kvCapacity  int64
	cacheLabels [][2]string
}

// write renders the Prometheus text exposition (version 0.0.4).
func (m *vllmMetrics) write(w io.Writer, v metricsView) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	base := [][2]string{{"engine", "0"}, {"model_name", v.modelName}}
	usage := 0.0
	if v.kvCapacity > 0 {
		usage = math.Min(1, float64(max(m.kvTokens, 0))/float64(v.kvCapacity))
	}
	var b strings.Builder
	gauge := func(name, help string, val float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s%s %s\n", name, help, name, name, labels(base), num(val))
	}
	counter := func(name, help string, val uint64) {
		fmt.Fprintf(&b, "# HELP %s_total %s\n# TYPE %s_total counter\n%s_total%s %s\n", name, help, name, name, labels(base), num(float64(val)))
		fmt.Fprintf(&b, "%s_created%s %s\n", name, labels(base), num(m.created))
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(v.running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(v.waiting))
	if v.sleep != nil {
		awake, offloaded, discarded := v.sleep.sleepState()
		b.WriteString("# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; " +
			"weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n# TYPE vllm:engine_sleep_state gauge\n")
		for _, st := range []struct {
			label string
			val   float64
		}{{"awake", awake}, {"weights_offloaded", offloaded}, {"discard_all", discarded}} {
			l := append(append([][2]string{}, base...), [2]string{"sleep_state", st.label})
			fmt.Fprintf(&b, "vllm:engine_sleep_state%s %s\n", labels(l), num(st.val))
		}
	}
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
	gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.", usage)
	counter("vllm:prompt_tokens", "Number of prefill tokens processed.", m.promptTokens)
	counter("vllm:generation_tokens", "Number of generation tokens processed.", m.generationTokens)

	b.WriteString("# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter\n")
	reasons := make([]string, 0, len(m.success))
	for r := range m.success {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		l := append(append([][2]string{}, base...), [2]string{"finished_reason", r})
		fmt.Fprintf(&b, "vllm:request_success_total%s %s\n", labels(l), num(float64(m.success[r])))
	}
	writeHistogram(&b, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", base, m.ttft)
	writeHistogram(&b, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", base, m.e2e)

	b.WriteString("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	fmt.Fprintf(&b, "vllm:cache_config_info%s 1.0\n", labels(v.cacheLabels))
	_, err := io.WriteString(w, b.String())
	return err
}

func writeHistogram(b *strings.Builder, name, help string, base [][2]string, h *histogram) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	var cum uint64
	for i, bound := range h.bounds {
		cum += h.counts[i]
		l := append(append([][2]string{}, base...), [2]string{"le", num(bound)})
		fmt.Fprintf(b, "%s_bucket%s %s\n", name, labels(l), num(float64(cum)))
	}
	l := append(append([][2]string{}, base...), [2]string{"le", "+Inf"})
	fmt.Fprintf(b, "%s_bucket%s %s\n", name, labels(l), num(float64(h.count)))
	fmt.Fprintf(b, "%s_count%s %s\n", name, labels(base), num(float64(h.count)))
	fmt.Fprintf(b, "%s_sum%s %s\n", name, labels(base), num(h.sum))
}

// labels renders {k="v",…} sorted by key, escaping values as the text format
// requires.
func labels(kv [][2]string) string {
	sorted := append([][2]string{}, kv...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i][0] < sorted[j][0] })
	var b strings.Builder
	b.WriteByte('{')
	for i, p := range sorted {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p[0])
		b.WriteString(`="`)
		b.WriteString(escapeLabel(p[1]))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// num formats like Python's prometheus_client: whole numbers keep ".0".
func num(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
