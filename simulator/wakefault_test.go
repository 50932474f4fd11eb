package simulator

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestWakeFaults: each wake fault leaves a cold engine healthy and arms at
// the wake (hang, output, slow) or at the second sleep (residual).
func TestWakeFaults(t *testing.T) {
	reply := func(t *testing.T, s *sim) string {
		t.Helper()
		code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{"max_tokens": 5, "temperature": 0}))
		if code != http.StatusOK {
			t.Fatalf("chat = %d %s", code, body)
		}
		r := decode[struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}](t, body)
		return r.Choices[0].Message.Content
	}
	timed := func(t *testing.T, s *sim) time.Duration {
		t0 := time.Now()
		reply(t, s)
		return time.Since(t0)
	}
	for _, fault := range []string{WakeFaultHang, WakeFaultOutput, WakeFaultSlow, WakeFaultResidual} {
		t.Run(fault, func(t *testing.T) {
			s, dir := sleepyVLLM(t, func(o *Options) { o.WakeFault = fault; o.DecodeTPS = 100 })
			before := reply(t, s)
			post(t, s, "/sleep?level=1")
			wantClaim(t, dir, tResidual, tWeights)
			post(t, s, "/wake_up")
			switch fault {
			case WakeFaultHang:
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/chat/completions",
					strings.NewReader(`{"model":"qwen3-coder","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
					t.Errorf("a generation after the wake answered %s; want it to hang until the client gives up", resp.Status)
				}
				if isSleeping(t, s) {
					t.Error("is_sleeping after the wake")
				}
			case WakeFaultOutput:
				if after := reply(t, s); after == before || !strings.Contains(after, "garbled") {
					t.Errorf("after the wake %q, before %q; want other words", after, before)
				}
			case WakeFaultSlow:
				// Timers never fire early: 4 token intervals at half of
				// 100 tokens/s take at least 80 ms.
				if d := timed(t, s); d < 80*time.Millisecond {
					t.Errorf("5 tokens after the wake took %s; want ≥ 80 ms (half of 100 tokens/s)", d)
				}
			case WakeFaultResidual:
				if after := reply(t, s); after != before {
					t.Errorf("the residual fault changed the reply: %q → %q", before, after)
				}
				post(t, s, "/sleep?level=1")
				wantClaim(t, dir, tResidual+wakeFaultResidualMiB, tWeights)
			}
		})
	}
}

func TestWakeFaultValidated(t *testing.T) {
	if _, err := (Options{Flavor: FlavorVLLM, Model: "m", WakeFault: "sometimes"}).withDefaults(); err == nil || !strings.Contains(err.Error(), `wake fault "sometimes"`) {
		t.Fatalf("err = %v; want it to name the wake fault", err)
	}
}
