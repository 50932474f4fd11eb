package metrics

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// TestProxyRequestsByAPI: one request of each /v1 API through the real
// proxy, to a backend that answers each in its API's own usage format:
// gpuhost_proxy_requests_total and gpuhost_proxy_tokens_total count them
// under the API's name (the access log's), with the tokens the backend
// reported; count_tokens' answer is not usage, and a sum over api gives
// the per-model totals (the recording rules sum by model).
func TestProxyRequestsByAPI(t *testing.T) {
	answers := map[string]string{ // by path: what the backend answers
		"/v1/chat/completions":      `{"object":"chat.completion","usage":{"prompt_tokens":11,"completion_tokens":3}}`,
		"/v1/completions":           `{"object":"text_completion","usage":{"prompt_tokens":12,"completion_tokens":4}}`,
		"/v1/embeddings":            `{"object":"list","data":[],"usage":{"prompt_tokens":13,"total_tokens":13}}`,
		"/v1/messages":              `{"type":"message","role":"assistant","usage":{"input_tokens":14,"output_tokens":5}}`,
		"/v1/messages/count_tokens": `{"input_tokens":15}`,
		"/v1/responses":             `{"object":"response","status":"completed","usage":{"input_tokens":16,"output_tokens":6}}`,
		"/v1/rerank":                `{"results":[],"usage":{"prompt_tokens":17,"completion_tokens":0}}`,
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := answers[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(up.Close)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(up.URL, "http://"))
	n, _ := strconv.Atoi(port)
	prof := &units.Profile{Name: "p", Backend: units.VLLM, Model: "org/model", ServedName: "served", Port: n}
	px := proxy.New(appliancetest.Fixed{Profile: prof}, config.ProxyConfig{}, func() map[string]*units.Profile {
		return map[string]*units.Profile{prof.Name: prof}
	}, slog.New(slog.DiscardHandler))
	s := serve(t, appliancetest.New(t, appliancetest.Options{}))
	px.SetObserver(s.m)
	e := echo.New()
	px.Register(e)
	front := httptest.NewServer(e)
	t.Cleanup(func() { front.Close(); px.Close() })

	for path := range answers {
		resp, err := http.Post(front.URL+path, "application/json", strings.NewReader(`{"model":"served","input":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(data) != answers[path] {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, data)
		}
	}
	tests := []struct {
		api           string
		prompt, compl float64 // 0: no series
		tokenSeries   int
	}{
		{"chat", 11, 3, 2}, {"completions", 12, 4, 2}, {"embeddings", 13, 0, 1}, {"messages", 14, 5, 2},
		{"count_tokens", 0, 0, 0}, {"responses", 16, 6, 2}, {"other", 17, 0, 1},
	}
	var sumPrompt, sumCompl float64
	for _, tc := range tests {
		sumPrompt, sumCompl = sumPrompt+tc.prompt, sumCompl+tc.compl
	}
	// The observer is called once the answer is complete, which the client
	// may see a moment earlier; each call counts the request, then its
	// tokens.
	var fams families
	var gotPrompt, gotCompl float64
	if !testkit.Poll(10*time.Second, func() bool {
		fams = s.scrape(t)
		gotPrompt, gotCompl = tokenSums(fams, "served")
		return len(fams.find("gpuhost_proxy_requests_total", nil)) == len(answers) && gotPrompt == sumPrompt && gotCompl == sumCompl
	}) {
		t.Fatalf("%d request series, want %d; a sum over api of %v prompt and %v completion tokens, want %v and %v",
			len(fams.find("gpuhost_proxy_requests_total", nil)), len(answers), gotPrompt, gotCompl, sumPrompt, sumCompl)
	}
	for _, tc := range tests {
		byAPI := map[string]string{"api": tc.api, "model": "served"}
		if got := fams.value(t, "gpuhost_proxy_requests_total", map[string]string{"api": tc.api, "model": "served", "code": "200"}); got != 1 {
			t.Errorf("requests{api=%s} = %v, want 1", tc.api, got)
		}
		if got := len(fams.find("gpuhost_proxy_tokens_total", byAPI)); got != tc.tokenSeries {
			t.Errorf("tokens{api=%s}: %d series, want %d", tc.api, got, tc.tokenSeries)
		}
		for kind, want := range map[string]float64{"prompt": tc.prompt, "completion": tc.compl} {
			if want == 0 {
				continue
			}
			if got := fams.value(t, "gpuhost_proxy_tokens_total", map[string]string{"api": tc.api, "model": "served", "kind": kind}); got != want {
				t.Errorf("tokens{api=%s,kind=%s} = %v, want %v (the backend's)", tc.api, kind, got, want)
			}
		}
	}
}

// tokenSums adds a model's prompt and completion tokens over every api.
func tokenSums(fams families, model string) (prompt, completion float64) {
	for _, m := range fams.find("gpuhost_proxy_tokens_total", map[string]string{"model": model}) {
		for _, lp := range m.GetLabel() {
			switch {
			case lp.GetName() != "kind":
			case lp.GetValue() == "prompt":
				prompt += m.GetCounter().GetValue()
			default:
				completion += m.GetCounter().GetValue()
			}
		}
	}
	return prompt, completion
}
