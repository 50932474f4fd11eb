// Package backend speaks the inference servers' own HTTP protocols: the
// steps of a switch that differ between vLLM and Ollama (is the server up,
// load the model, does it serve the profile's model). The Supervisor in
// package appliance drives the switch and decides when each step runs; this
// package only knows how one engine answers. It deliberately knows nothing
// of systemd, D-Bus or the Supervisor (it imports neither appliance nor
// systemd), so the Supervisor's tests can put a fake in its place.
//
// Every call takes its deadline from ctx: the caller bounds each request
// (a health poll by a second, a model load by the switch's ready timeout).
package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"gpuhost/internal/loopback"
	"gpuhost/units"
)

// Backend is one engine's protocol for one profile's server, as a switch
// uses it. Implementations: VLLM and Ollama.
//
// Steps only one engine has are optional interfaces that a Backend also
// implements, checked with a type assertion, so that the switch knows
// before it starts a step whether the step applies (and emits no events
// for one that does not). Loader is the first. The standby operations of
// the next issue fit the same way, without changing Backend, for example
//
//	// Sleeper frees the GPU while the server (and its unit) keeps running.
//	type Sleeper interface {
//		Sleep(ctx context.Context) (msg string, err error) // vLLM: POST /sleep; Ollama: unload (keep_alive 0)
//		Wake(ctx context.Context) (msg string, err error)  // vLLM: POST /wake_up; Ollama: Load
//	}
//
// (vLLM serves /sleep?level=N, /wake_up and /is_sleeping only when started
// with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, so whether a VLLM is
// a Sleeper may come to depend on the profile.)
type Backend interface {
	// HealthURL is the readiness endpoint Health asks (units.HealthPath),
	// for the switch's messages.
	HealthURL() string
	// Health asks the readiness endpoint once: nil when it answers 200 OK.
	// The switch polls it until the server is up.
	Health(ctx context.Context) error
	// Verify asks the server which models it serves and fails unless the
	// profile's is among them. detail holds what the server reported of it
	// (vLLM: max_model_len; Ollama: size_vram), for the verify step's
	// event; it is returned (possibly empty) with a mismatch too, and is
	// nil when the server did not answer.
	Verify(ctx context.Context) (detail map[string]any, err error)
}

// Loader is a Backend whose model is loaded by a request after the server
// answers (Ollama loads on demand, so the switch loads it rather than the
// first client). vLLM has loaded its model before /health answers and is
// no Loader: its switch has no load_model step.
type Loader interface {
	// Load loads the profile's model and says what the server reported.
	Load(ctx context.Context) (msg string, err error)
}

// Factory makes the Backend of profile p, whose server answers at baseURL
// ("http://127.0.0.1:8000"), talking through client.
type Factory func(p units.Profile, client *http.Client, baseURL string) Backend

// Engines returns the factories of the real engines, keyed by the
// profile's backend. The Supervisor holds such a map; tests substitute
// entries.
func Engines() map[units.Backend]Factory {
	return map[units.Backend]Factory{
		units.VLLM:   func(p units.Profile, c *http.Client, base string) Backend { return NewVLLM(p, c, base) },
		units.Ollama: func(p units.Profile, c *http.Client, base string) Backend { return NewOllama(p, c, base) },
	}
}

// NewClient talks to the backends on loopback: no proxy from the
// environment, no kept-alive connections to a backend that is being
// replaced.
func NewClient() *http.Client { return NewClientVia(nil) }

// NewClientVia is NewClient dialling through d: under systemd the daemon's
// loopback.Dialer, which reaches each backend port through its unix socket
// (the backend's own 127.0.0.1 is in its private network). Nil d: TCP.
func NewClientVia(d *loopback.Dialer) *http.Client {
	if d == nil {
		d = &loopback.Dialer{}
	}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DialContext: d.DialContext}}
}

// health GETs url and discards the body: nil for 200 OK.
func health(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return nil
}

// GetJSON GETs url and decodes its JSON answer (at most 8 MiB) into v; a
// status other than 200 OK is an error.
func GetJSON(ctx context.Context, client *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: decode: %w", url, err)
	}
	return nil
}
