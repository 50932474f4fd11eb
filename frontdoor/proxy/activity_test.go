package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"gpuhost/appliance/appliancetest"
	"gpuhost/internal/activity"
	"gpuhost/internal/testkit"
)

// TestRecorderGetsEachRequest: with an activity log installed beside the
// metrics observer, each /v1 request is one entry with the TCP peer's
// address (not X-Forwarded-For), the served model it resolved to (not the
// client's text), its status and usage; no prompt, header or token is in
// it. The observer still sees every request.
func TestRecorderGetsEachRequest(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder"})
	log := activity.NewLog(10)
	e.p.SetRecorder(log)
	send := func(model string, stream bool) int {
		t.Helper()
		body := chatBody(t, model, stream, 12, map[string]any{"ignore_eos": true, "messages": []any{map[string]any{"role": "user", "content": "SECRET-PROMPT-TEXT"}}})
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer SECRET-TOKEN")
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send("qwen3-coder", true); code != http.StatusOK {
		t.Fatalf("stream: %d", code)
	}
	if code := send("qwen3-coder", false); code != http.StatusOK {
		t.Fatalf("whole: %d", code)
	}
	if code := send("<script>alert(1)</script>", false); code != http.StatusNotFound {
		t.Fatalf("unknown model: %d", code)
	}
	var got []activity.Request
	if !testkit.Poll(10*time.Second, func() bool { got = log.Recent(activity.Filter{}, 0); return len(got) == 3 }) {
		t.Fatalf("%d entries, want 3: %+v", len(got), got)
	}
	unknown, whole, stream := got[0], got[1], got[2] // newest first
	for _, r := range got {
		if r.Client != "127.0.0.1" || r.Method != http.MethodPost || r.Path != "/v1/chat/completions" || r.Time.IsZero() || r.Duration <= 0 {
			t.Errorf("entry %+v", r)
		}
		data, _ := json.Marshal(r)
		for _, secret := range []string{"SECRET", "203.0.113.9", "script"} {
			if strings.Contains(string(data), secret) {
				t.Errorf("entry carries %q: %s", secret, data)
			}
		}
	}
	if !stream.Stream || stream.Model != "qwen3-coder" || stream.Profile != "coder" || stream.Status != 200 ||
		stream.CompletionTokens != 12 || stream.PromptTokens <= 0 || stream.TTFB <= 0 || stream.TokensPerSecond() <= 0 {
		t.Errorf("stream entry %+v", stream)
	}
	if whole.Stream || whole.CompletionTokens != 12 || whole.Status != 200 {
		t.Errorf("whole entry %+v", whole)
	}
	if unknown.Model != "" || unknown.Status != http.StatusNotFound {
		t.Errorf("unknown model entry %+v", unknown)
	}
	if obs := e.obs.waitFor(t, 3); len(obs) != 3 {
		t.Errorf("the metrics observer saw %d requests", len(obs))
	}
	e.p.SetRecorder(nil)
	send("qwen3-coder", false)
	e.obs.waitFor(t, 4)
	if n := log.LastSeq(); n != 3 {
		t.Errorf("after SetRecorder(nil) the log has %d entries", n)
	}
}
