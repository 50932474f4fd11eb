package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"gpuhost/units"
)

// Sleeper is a Backend that can give its GPU memory back while its server
// (and so its unit) keeps running, and take it again in seconds: vLLM's
// sleep mode, Ollama's unload. The Supervisor decides when and at which
// level; this is only how each engine is asked.
type Sleeper interface {
	// Sleep puts the server into standby. level is 1 or 2 for vLLM (weights
	// to host RAM, or discarded) and ignored by Ollama (the model unloads).
	Sleep(ctx context.Context, level int) (msg string, err error)
	// Wake brings the server back from standby at the level it slept at
	// (vLLM level 2 reloads the weights; Ollama loads the model).
	Wake(ctx context.Context, level int) (msg string, err error)
	// Sleeping asks the server whether it is in standby now.
	Sleeping(ctx context.Context) (bool, error)
}

// statusError is an answer with a status other than 200.
type statusError struct {
	url  string
	code int
	body string // its first KiB
}

func (e *statusError) Error() string {
	return fmt.Sprintf("POST %s: status %d: %s", e.url, e.code, e.body)
}

// post sends a POST with an optional JSON body and returns the answer's
// first KiB, failing on any status but 200 (a *statusError).
func post(ctx context.Context, client *http.Client, url string, body any) (string, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return "", err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, rd)
	if err != nil {
		return "", err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	text := strings.TrimSpace(string(data))
	if resp.StatusCode != http.StatusOK {
		return "", &statusError{url: url, code: resp.StatusCode, body: text}
	}
	return text, nil
}

// vllmPost is post to one of vLLM's sleep endpoints: a 404 there means the
// server was started without them, and the error says how to get them.
// (Ollama's 404 is a different thing, a model it does not have, and keeps
// Ollama's own message.)
func vllmPost(ctx context.Context, client *http.Client, url string, body any) (string, error) {
	text, err := post(ctx, client, url, body)
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusNotFound {
		return "", fmt.Errorf("POST %s: status 404: the server has no such endpoint (vLLM serves the sleep endpoints only with --enable-sleep-mode and %s=1; set the profile's standby)", url, units.EnvVLLMDevMode)
	}
	return text, err
}

// Sleep asks vLLM to sleep: POST /sleep?level=N. vLLM answers once the
// engine has released its memory.
func (v *VLLM) Sleep(ctx context.Context, level int) (string, error) {
	if level != 1 && level != 2 {
		return "", fmt.Errorf("vLLM sleep level %d: must be 1 or 2", level)
	}
	if _, err := vllmPost(ctx, v.client, fmt.Sprintf("%s/sleep?level=%d", v.base, level), nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s sleeps at level %d", v.p.ServedModelName(), level), nil
}

// Wake wakes vLLM. After level 1 one wake_up brings weights and KV cache
// back. After level 2 the weights are gone, so the documented sequence is
// followed: wake the weights' memory, reload the weights, then wake the KV
// cache (a plain wake_up would run the model on garbage).
func (v *VLLM) Wake(ctx context.Context, level int) (string, error) {
	if level == 2 {
		steps := []struct {
			path string
			body any
		}{
			{"/wake_up?tags=weights", nil},
			{"/collective_rpc", map[string]any{"method": "reload_weights"}},
			{"/wake_up?tags=kv_cache", nil},
		}
		for _, s := range steps {
			if _, err := vllmPost(ctx, v.client, v.base+s.path, s.body); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("%s woke from level 2 (weights reloaded)", v.p.ServedModelName()), nil
	}
	if _, err := vllmPost(ctx, v.client, v.base+"/wake_up", nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s woke from level 1", v.p.ServedModelName()), nil
}

// Sleeping asks GET /is_sleeping.
func (v *VLLM) Sleeping(ctx context.Context) (bool, error) {
	var out struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := GetJSON(ctx, v.client, v.base+"/is_sleeping", &out); err != nil {
		return false, err
	}
	if out.IsSleeping == nil {
		return false, fmt.Errorf("GET %s/is_sleeping: no is_sleeping in the answer", v.base)
	}
	return *out.IsSleeping, nil
}

// Sleep unloads the model: a generate request without a prompt and with
// keep_alive 0. An idle `ollama serve` holds no GPU memory. Ollama answers
// that request at once (200, done_reason "unload") and unloads in the
// background: the model stays in /api/ps, its runner process alive, a few
// milliseconds more (Ollama 0.17.4: the scheduler expires the runner
// asynchronously). So Sleep then waits, within ctx, until /api/ps no
// longer lists the model: like vLLM's /sleep, it returns once the server
// is in standby, whether or not NVML can see the memory go.
func (o *Ollama) Sleep(ctx context.Context, _ int) (string, error) {
	t0 := time.Now()
	text, err := post(ctx, o.client, o.base+"/api/generate", map[string]any{"model": o.p.Model, "keep_alive": 0, "stream": false})
	if err != nil {
		return "", fmt.Errorf("unload %s: %w", o.p.Model, err)
	}
	var ans struct {
		DoneReason string `json:"done_reason"`
	}
	_ = json.Unmarshal([]byte(text), &ans)
	wait := unloadPollMin
	var listed []string // what the last /api/ps that answered listed
	answered := false
	for {
		_, names, found, err := o.loaded(ctx)
		if err == nil && !found {
			return fmt.Sprintf("unloaded %s (done_reason %q; gone from /api/ps after %s)", o.p.Model, ans.DoneReason,
				time.Since(t0).Round(time.Millisecond)), nil
		}
		if err == nil {
			listed, answered = names, true
		}
		select {
		case <-ctx.Done():
			// A poll that the deadline itself cut says nothing new: what
			// the last answer listed is the reason.
			cut := answered && errors.Is(err, ctx.Err())
			if err != nil && !cut {
				return "", fmt.Errorf("unload %s: Ollama answered %q, then /api/ps: %w", o.p.Model, text, err)
			}
			return "", fmt.Errorf("unload %s: Ollama answered %q but /api/ps still lists %v: %w", o.p.Model, text, listed, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, unloadPollMax)
	}
}

// The unload poll of /api/ps starts at unloadPollMin and doubles up to
// unloadPollMax (the tiny test model is gone after 5–8 ms).
const (
	unloadPollMin = 5 * time.Millisecond
	unloadPollMax = 200 * time.Millisecond
)

// Wake loads the model again (Load).
func (o *Ollama) Wake(ctx context.Context, _ int) (string, error) { return o.Load(ctx) }

// Sleeping reports whether the profile's model is absent from /api/ps.
func (o *Ollama) Sleeping(ctx context.Context) (bool, error) {
	_, _, found, err := o.loaded(ctx)
	return !found && err == nil, err
}

// Foreign lists the models Ollama has loaded other than the profile's
// (someone loaded one behind gpuhost's back: it holds GPU memory the
// profile was sized without).
func (o *Ollama) Foreign(ctx context.Context) ([]string, error) {
	_, names, _, err := o.loaded(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if !SameOllamaModel(n, o.p.Model) {
			out = append(out, n)
		}
	}
	return out, nil
}

// UnloadOther unloads one model that is not the profile's, the way Sleep
// unloads the profile's own (keep_alive 0); it does not wait for /api/ps.
func (o *Ollama) UnloadOther(ctx context.Context, model string) error {
	if _, err := post(ctx, o.client, o.base+"/api/generate", map[string]any{"model": model, "keep_alive": 0, "stream": false}); err != nil {
		return fmt.Errorf("unload %s: %w", model, err)
	}
	return nil
}

var (
	_ Sleeper = (*VLLM)(nil)
	_ Sleeper = (*Ollama)(nil)
)
