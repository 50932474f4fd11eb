package proxy

import (
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gpuhost/internal/apishape"
	"gpuhost/units"
)

// TestUsageCountedOnlyWhenSane: usage a backend reports is counted only
// when it is non-negative, within the ceiling, the request's max tokens
// (times its choices) and the vLLM profile's context, and sent before the
// stream's final event; every refusal is counted by reason, and an
// absurd count never reaches the totals.
func TestUsageCountedOnlyWhenSane(t *testing.T) {
	vllm := &units.Profile{Name: "p", Backend: units.VLLM, VLLM: units.VLLMFlags{MaxModelLen: 32768}}
	ollama := &units.Profile{Name: "o", Backend: units.Ollama}
	chat := func(prompt, compl string) string {
		return `data: {"choices":[]}` + "\n\n" + `data: {"choices":[],"usage":{"prompt_tokens":` + prompt + `,"completion_tokens":` + compl + "}}\n\ndata: [DONE]\n\n"
	}
	tests := []struct {
		name         string
		kind         apishape.Kind
		mode         tapMode
		body         string
		field        modelField
		prof         *units.Profile
		prompt, comp int
		refused      string
	}{
		{"sane", apishape.Chat, tapSSE, chat("12", "3"), modelField{MaxTokens: 16}, vllm, 12, 3, ""},
		{"int64 max", apishape.Chat, tapSSE, chat("1", "9223372036854775807"), modelField{}, ollama, 0, 0, "too_large"},
		{"beyond int64: not read", apishape.Chat, tapSSE, chat("1", "92233720368547758070"), modelField{}, ollama, 0, 0, ""},
		{"negative", apishape.Chat, tapSSE, chat("-2", "3"), modelField{}, ollama, 0, 0, "negative"},
		{"over max_tokens", apishape.Chat, tapSSE, chat("5", "17"), modelField{MaxTokens: 16}, ollama, 0, 0, "over_max_tokens"},
		{"max_tokens times n", apishape.Chat, tapSSE, chat("5", "32"), modelField{MaxTokens: 16, Choices: 2}, ollama, 5, 32, ""},
		{"prompt over the vLLM context", apishape.Chat, tapSSE, chat("40000", "3"), modelField{}, vllm, 0, 0, "too_large"},
		{"Ollama's context is not a bound", apishape.Chat, tapSSE, chat("40000", "3"), modelField{}, ollama, 40000, 3, ""},
		{"completions batch: only the ceiling", apishape.Completions, tapJSON, `{"usage":{"prompt_tokens":90000,"completion_tokens":90}}`, modelField{MaxTokens: 16}, vllm, 90000, 90, ""},
		{"usage after [DONE]", apishape.Chat, tapSSE, chat("12", "3") + `data: {"usage":{"prompt_tokens":1,"completion_tokens":1000000}}` + "\n\n", modelField{}, ollama, 12, 3, "after_end"},
		{"usage after message_stop", apishape.Messages, tapSSE,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9999}}\n\n",
			modelField{MaxTokens: 100}, ollama, 10, 4, "after_end"},
		{"anthropic cache counts that would overflow", apishape.Messages, tapJSON,
			`{"usage":{"input_tokens":9223372036854775807,"cache_read_input_tokens":9223372036854775807,"output_tokens":1}}`, modelField{}, ollama, 0, 0, "too_large"},
		{"usage after response.completed", apishape.Responses, tapSSE,
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":2}}}\n\n" +
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":2000000}}}\n\n",
			modelField{}, ollama, 8, 2, "after_end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{usageRefused: newUsageRefusedCounter()}
			tap := newUsageTap(io.NopCloser(strings.NewReader(tc.body)), tc.mode, tc.kind)
			if _, err := io.Copy(io.Discard, tap); err != nil {
				t.Fatal(err)
			}
			rec := &record{api: tc.kind, tap: tap, limits: limitsFor(tc.field, tc.prof)}
			prompt, compl, refused := p.countedUsage(rec)
			if prompt != tc.prompt || compl != tc.comp || refused != tc.refused {
				t.Errorf("counted %d/%d refused %q, want %d/%d refused %q", prompt, compl, refused, tc.prompt, tc.comp, tc.refused)
			}
			for _, reason := range []string{"negative", "too_large", "over_max_tokens", "after_end"} {
				want := 0.0
				if reason == tc.refused {
					want = 1
				}
				if got := testutil.ToFloat64(p.usageRefused.WithLabelValues(reason)); got != want {
					t.Errorf("gpuhost_proxy_usage_refused_total{reason=%q} = %v, want %v", reason, got, want)
				}
			}
		})
	}
}

// TestPeekLimits: the request's max tokens and choices are read from the
// top level only.
func TestPeekLimits(t *testing.T) {
	for _, tc := range []struct {
		body       string
		max, choic int64
	}{
		{`{"model":"m","max_tokens":16}`, 16, 0},
		{`{"max_completion_tokens":8,"max_tokens":32,"n":3}`, 32, 3},
		{`{"max_output_tokens":100}`, 100, 0},
		{`{"options":{"max_tokens":5},"n":"2"}`, 0, 0},
		{`{"max_tokens":-1,"n":0}`, 0, 0},
		{`{"max_tokens":1e3}`, 0, 0},
	} {
		f, err := peekModel([]byte(tc.body))
		if err != nil || f.MaxTokens != tc.max || f.Choices != tc.choic {
			t.Errorf("%s: max %d n %d (%v), want %d %d", tc.body, f.MaxTokens, f.Choices, err, tc.max, tc.choic)
		}
	}
}
