package backend

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
	"gpuhost/units"
)

// startSim runs the project's simulator in-process (simtest.Start).
func startSim(t *testing.T, o simulator.Options) string { return simtest.Start(t, o) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestVLLMAgainstSimulator(t *testing.T) {
	base := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct-AWQ",
		ServedName: "qwen3-coder", MaxModelLen: 65536})
	ctx := testCtx(t)
	p := units.Profile{Name: "coder", Backend: units.VLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct-AWQ", ServedName: "qwen3-coder"}
	var be Backend = NewVLLM(p, NewClient(), base)
	if _, ok := be.(Loader); ok {
		t.Error("vLLM is a Loader; its switch would get a load_model step")
	}
	if got, want := be.HealthURL(), base+"/health"; got != want {
		t.Errorf("HealthURL = %s, want %s", got, want)
	}
	if err := be.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	detail, err := be.Verify(ctx)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if detail["max_model_len"] != 65536 {
		t.Errorf("Verify detail = %v, want max_model_len 65536", detail)
	}

	p.ServedName = "other"
	detail, err = NewVLLM(p, NewClient(), base).Verify(ctx)
	if err == nil || err.Error() != `backend serves [qwen3-coder], not the profile's served_name "other"` {
		t.Errorf("Verify(wrong served name) = %v", err)
	}
	if detail == nil || len(detail) != 0 {
		t.Errorf("Verify(wrong served name) detail = %#v, want empty", detail)
	}
}

func TestOllamaAgainstSimulator(t *testing.T) {
	base := startSim(t, simulator.Options{Flavor: simulator.FlavorOllama, Model: "llama3.1:8b", Models: []string{"qwen3"}})
	ctx := testCtx(t)
	p := units.Profile{Name: "llama", Backend: units.Ollama, Model: "llama3.1:8b", ServedName: "llama3.1:8b"}
	var be Backend = NewOllama(p, NewClient(), base)
	if got, want := be.HealthURL(), base+"/api/version"; got != want {
		t.Errorf("HealthURL = %s, want %s", got, want)
	}
	if err := be.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	// Ollama answers before any model is loaded: verify fails until Load.
	if _, err := be.Verify(ctx); err == nil || err.Error() != `ollama has [] loaded, not "llama3.1:8b"` {
		t.Errorf("Verify before Load = %v", err)
	}
	l, ok := be.(Loader)
	if !ok {
		t.Fatal("Ollama is no Loader")
	}
	msg, err := l.Load(ctx)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if msg != `loaded llama3.1:8b (done_reason "load")` {
		t.Errorf("Load = %q", msg)
	}
	detail, err := be.Verify(ctx)
	if err != nil {
		t.Fatalf("Verify after Load: %v", err)
	}
	if v, _ := detail["size_vram"].(int64); v <= 0 {
		t.Errorf("Verify detail = %v, want a size_vram", detail)
	}

	// The tag ":latest" is implied, as Ollama does.
	p.Model = "qwen3"
	if _, err := NewOllama(p, NewClient(), base).Load(ctx); err != nil {
		t.Fatalf("Load(qwen3): %v", err)
	}
	if _, err := NewOllama(p, NewClient(), base).Verify(ctx); err != nil {
		t.Errorf("Verify(qwen3 loaded as qwen3:latest): %v", err)
	}

	p.Model = "nosuch:1b"
	_, err = NewOllama(p, NewClient(), base).Load(ctx)
	if err == nil || !strings.HasPrefix(err.Error(), "load nosuch:1b: status 404: ") {
		t.Errorf("Load(not pulled) = %v", err)
	}
}

// TestOllamaLoadRequest checks the generate request against the API's
// shape: keep_alive a number when it is one, else a duration string.
func TestOllamaLoadRequest(t *testing.T) {
	for _, tt := range []struct {
		keep string
		want any
	}{
		{"", float64(-1)},
		{"-1", float64(-1)},
		{"0", float64(0)},
		{"10m", "10m"},
	} {
		var got map[string]any
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost || r.URL.Path != "/api/generate" || r.Header.Get("Content-Type") != "application/json" {
				t.Errorf("request %s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
			}
			_ = json.NewDecoder(r.Body).Decode(&got)
			_, _ = io.WriteString(w, `{"model":"m","response":"","done":true,"done_reason":"load"}`)
		}))
		p := units.Profile{Backend: units.Ollama, Model: "m", Ollama: units.OllamaOpts{KeepAlive: tt.keep}}
		if _, err := NewOllama(p, NewClient(), srv.URL).Load(testCtx(t)); err != nil {
			t.Fatalf("keep_alive %q: %v", tt.keep, err)
		}
		srv.Close()
		if got["model"] != "m" || got["stream"] != false || got["keep_alive"] != tt.want {
			t.Errorf("keep_alive %q: request %v, want keep_alive %#v", tt.keep, got, tt.want)
		}
	}
}

func TestErrors(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health", "/v1/models":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/api/version":
			select { // answers only when the client gives up
			case <-r.Context().Done():
			case <-hang:
			}
		case "/api/ps":
			_, _ = io.WriteString(w, "not json")
		}
	}))
	defer srv.Close()
	defer close(hang)
	ctx := testCtx(t)
	vllm := NewVLLM(units.Profile{Backend: units.VLLM, ServedName: "m"}, NewClient(), srv.URL)
	if err := vllm.Health(ctx); err == nil || err.Error() != "GET "+srv.URL+"/health: status 503" {
		t.Errorf("Health(503) = %v", err)
	}
	if d, err := vllm.Verify(ctx); err == nil || err.Error() != "GET "+srv.URL+"/v1/models: status 503" || d != nil {
		t.Errorf("Verify(503) = %v, %v", d, err)
	}
	ollama := NewOllama(units.Profile{Backend: units.Ollama, Model: "m"}, NewClient(), srv.URL)
	if _, err := ollama.Verify(ctx); err == nil || !strings.HasPrefix(err.Error(), "GET "+srv.URL+"/api/ps: decode: ") {
		t.Errorf("Verify(not JSON) = %v", err)
	}
	// The deadline is the caller's.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := ollama.Health(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Health(hanging server) = %v, want the context's deadline", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("Health took %s past a 50ms deadline", d)
	}
	// Nothing listens.
	srv.Close()
	if err := vllm.Health(ctx); err == nil || !strings.Contains(err.Error(), "GET "+srv.URL+"/health: ") {
		t.Errorf("Health(closed) = %v", err)
	}
	if _, err := ollama.Load(ctx); err == nil || !strings.HasPrefix(err.Error(), "load m: ") {
		t.Errorf("Load(closed) = %v", err)
	}
}

func TestEngines(t *testing.T) {
	e := Engines()
	if len(e) != 2 {
		t.Fatalf("Engines has %d entries", len(e))
	}
	if _, ok := e[units.VLLM](units.Profile{}, NewClient(), "http://x").(*VLLM); !ok {
		t.Error("Engines[vllm] is not VLLM")
	}
	if _, ok := e[units.Ollama](units.Profile{}, NewClient(), "http://x").(*Ollama); !ok {
		t.Error("Engines[ollama] is not Ollama")
	}
}

func TestSameOllamaModel(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"llama3.1:8b", "llama3.1:8b", true},
		{"qwen3", "qwen3:latest", true},
		{"qwen3:latest", "qwen3", true},
		{"qwen3:8b", "qwen3", false},
		{"", "", false},
		{"", ":latest", false},
	} {
		if got := SameOllamaModel(tt.a, tt.b); got != tt.want {
			t.Errorf("SameOllamaModel(%q, %q) = %v", tt.a, tt.b, got)
		}
	}
}
