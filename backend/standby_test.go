package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/simulator"
	"gpuhost/units"
)

func TestVLLMSleepWakeAgainstSimulator(t *testing.T) {
	for _, level := range []int{1, 2} {
		base := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "org/m", ServedName: "m",
			DevMode: true, EnableSleepMode: true})
		ctx := testCtx(t)
		var sl Sleeper = NewVLLM(units.Profile{Name: "p", Backend: units.VLLM, Model: "org/m", ServedName: "m"}, NewClient(), base)
		if asleep, err := sl.Sleeping(ctx); err != nil || asleep {
			t.Fatalf("level %d: Sleeping before sleep = %v, %v", level, asleep, err)
		}
		if _, err := sl.Sleep(ctx, level); err != nil {
			t.Fatalf("level %d: Sleep: %v", level, err)
		}
		if asleep, err := sl.Sleeping(ctx); err != nil || !asleep {
			t.Fatalf("level %d: Sleeping after sleep = %v, %v", level, asleep, err)
		}
		msg, err := sl.Wake(ctx, level)
		if err != nil {
			t.Fatalf("level %d: Wake: %v", level, err)
		}
		if asleep, err := sl.Sleeping(ctx); err != nil || asleep {
			t.Fatalf("level %d: Sleeping after wake = %v, %v (%s)", level, asleep, err, msg)
		}
		// The model answers again: level 2 must have reloaded the weights.
		if _, err := NewVLLM(units.Profile{ServedName: "m"}, NewClient(), base).Verify(ctx); err != nil {
			t.Errorf("level %d: verify after wake: %v", level, err)
		}
	}
}

func TestVLLMSleepWithoutDevModeSaysWhy(t *testing.T) {
	base := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "org/m", ServedName: "m"})
	_, err := NewVLLM(units.Profile{Backend: units.VLLM, Model: "org/m"}, NewClient(), base).Sleep(testCtx(t), 1)
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), units.EnvVLLMDevMode) {
		t.Errorf("sleep without dev mode: %v, want a 404 that names %s", err, units.EnvVLLMDevMode)
	}
	if _, err := NewVLLM(units.Profile{}, NewClient(), base).Sleep(testCtx(t), 3); err == nil || !strings.Contains(err.Error(), "must be 1 or 2") {
		t.Errorf("sleep level 3: %v", err)
	}
}

func TestOllamaUnloadLoadAgainstSimulator(t *testing.T) {
	base := startSim(t, simulator.Options{Flavor: simulator.FlavorOllama, Model: "llama3.1:8b"})
	ctx := testCtx(t)
	o := NewOllama(units.Profile{Name: "llama", Backend: units.Ollama, Model: "llama3.1:8b"}, NewClient(), base)
	if _, err := o.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if asleep, err := o.Sleeping(ctx); err != nil || asleep {
		t.Fatalf("Sleeping with the model loaded = %v, %v", asleep, err)
	}
	if _, err := o.Sleep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if asleep, err := o.Sleeping(ctx); err != nil || !asleep {
		t.Fatalf("Sleeping after unload = %v, %v", asleep, err)
	}
	if _, err := o.Wake(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Verify(ctx); err != nil {
		t.Errorf("verify after wake: %v", err)
	}
}

// TestOllamaSleepWaitsForTheUnload follows the real Ollama (0.17.4): the
// unload request is answered at once, done_reason "unload", while /api/ps
// lists the model a few milliseconds more. Sleep returns only once it is
// gone, and an unknown model's 404 keeps Ollama's message (not vLLM's
// sleep-mode hint).
func TestOllamaSleepWaitsForTheUnload(t *testing.T) {
	var mu sync.Mutex
	listedFor := 0   // /api/ps answers that still list the model
	afterUnload := 3 // what an unload request sets listedFor to
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/generate", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Model != "tiny" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":"model '%s' not found"}`, req.Model)
			return
		}
		mu.Lock()
		listedFor = afterUnload
		mu.Unlock()
		fmt.Fprint(w, `{"model":"tiny","created_at":"2026-01-01T00:00:00Z","response":"","done":true,"done_reason":"unload"}`)
	})
	hang := false // /api/ps answers once more, then never (until the client gives up)
	mux.HandleFunc("GET /api/ps", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if hang && listedFor == 0 {
			mu.Unlock()
			<-r.Context().Done()
			mu.Lock()
			return
		}
		if hang {
			listedFor = 0
			fmt.Fprint(w, `{"models":[{"name":"tiny:latest","model":"tiny:latest","size_vram":0}]}`)
			return
		}
		if listedFor > 0 {
			listedFor--
			fmt.Fprint(w, `{"models":[{"name":"tiny:latest","model":"tiny:latest","size_vram":0}]}`)
			return
		}
		fmt.Fprint(w, `{"models":[]}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := testCtx(t)
	o := NewOllama(units.Profile{Name: "tiny", Backend: units.Ollama, Model: "tiny"}, NewClient(), srv.URL)
	msg, err := o.Sleep(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	left := listedFor
	mu.Unlock()
	if left != 0 || !strings.Contains(msg, `done_reason "unload"`) {
		t.Errorf("Sleep returned %q with the model still listed for %d more /api/ps answers", msg, left)
	}
	if asleep, err := o.Sleeping(ctx); err != nil || !asleep {
		t.Errorf("Sleeping right after Sleep = %v, %v", asleep, err)
	}
	_, err = NewOllama(units.Profile{Name: "x", Backend: units.Ollama, Model: "nosuch"}, NewClient(), srv.URL).Sleep(ctx, 0)
	if err == nil || !strings.Contains(err.Error(), "model 'nosuch' not found") || strings.Contains(err.Error(), "vLLM") {
		t.Errorf("unload of an unknown model: %v", err)
	}
	// Within its context only: a model that never leaves /api/ps fails,
	// naming what /api/ps listed, also when the deadline cuts a poll (it
	// did on a loaded machine) or /api/ps stops answering.
	for _, c := range []struct {
		name string
		hang bool
	}{{"never leaves", false}, {"then /api/ps hangs", true}} {
		mu.Lock()
		afterUnload, hang = 1<<30, c.hang
		mu.Unlock()
		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err := o.Sleep(short, 0)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "still lists [tiny:latest]") || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
