package appliance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/bench/ollamatest"
	"gpuhost/internal/testkit"
)

// TestSwitchToRealOllama runs the Ollama profile's unit, under the private
// systemd, as the real `ollama serve` (built from the Go module proxy) with
// a tiny model the project generates: the Supervisor's Ollama path
// (readiness, model load, /api/ps check) against the real thing.
func TestSwitchToRealOllama(t *testing.T) {
	e := startRealOllamaE2E(t, prepareRealOllama(t), func(y string) string {
		return strings.Replace(y, "model: llama3.1:8b", "model: tiny", 1)
	})
	for _, p := range []string{"coder", "llama", "coder", "llama"} {
		evs := e.switchTo(t, p)
		if p != "llama" {
			continue
		}
		for _, step := range []string{"ready", "load_model", "verify"} {
			if _, ok := stepEvent(evs, step, "done"); !ok {
				t.Errorf("switch to the real Ollama lacks a done %s step:%s", step, describe(evs))
			}
		}
	}
	// The real server says the model is loaded, on the profile's port.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/api/ps", e.cfg.Profiles["llama"].Port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ps struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil || len(ps.Models) != 1 || ps.Models[0].Name != "tiny:latest" {
		t.Errorf("/api/ps of the real Ollama: %+v %v", ps, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.client.Status(ctx)
	if err != nil || st.State.Phase != api.PhaseActive || st.State.Profile != "llama" {
		t.Errorf("status: %+v %v", st.State, err)
	}
	// Ollama 0.17.4 serves Messages and Responses but no count_tokens; the
	// verify step found that out and /api/profiles says it.
	for _, p := range st.Profiles {
		if p.Name == "llama" && strings.Join(p.APIs, ",") != "chat,messages,responses" {
			t.Errorf("the real Ollama's APIs: %v", p.APIs)
		}
	}
	rep, err := e.client.Doctor(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		// The tiny model's template has no tools: Ollama's 400 is a warning;
		// /api/ps reports the context the profile asks for (the default).
		if c.ID == "endpoint.tool_calls" && (c.Severity != "warn" || !strings.Contains(c.Message, "does not support tools")) {
			t.Errorf("endpoint.tool_calls on the real Ollama: %+v", c)
		}
		if c.ID == "endpoint.context" && (c.Severity != "ok" || !strings.Contains(c.Message, "serves 4096 tokens")) {
			t.Errorf("endpoint.context on the real Ollama: %+v", c)
		}
		if c.ID == "endpoint.health" && c.Severity != "ok" {
			t.Errorf("doctor on the real Ollama: %+v", c)
		}
	}
}

// realOllama is the real Ollama prepared for a test under the private
// systemd: the binary, and the state folder whose model store holds the
// tiny model as "tiny".
type realOllama struct {
	bin, state, models, home string
}

// prepareRealOllama finds (or builds) the binary and creates the tiny model
// once, with a throwaway server on the store the unit will use.
func prepareRealOllama(t *testing.T) realOllama {
	t.Helper()
	o := realOllama{bin: ollamatest.Binary(t), state: t.TempDir()}
	o.models = filepath.Join(o.state, "ollama-models")
	o.home = filepath.Join(o.state, "ollama-home")
	for _, d := range []string{o.models, o.home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port := testkit.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := exec.Command(o.bin, "serve")
	srv.Env = append(os.Environ(), "OLLAMA_HOST="+strings.TrimPrefix(base, "http://"), "OLLAMA_MODELS="+o.models, "HOME="+o.home)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/api/version")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			srv.Process.Kill()
			t.Fatalf("ollama serve did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ollamatest.Create(t, o.bin, base, "tiny", ollamatest.Modelfile(t, filepath.Join(o.state, "model")))
	srv.Process.Kill()
	srv.Wait()
	return o
}

// startRealOllamaE2E deploys gpuhost into the private systemd with the
// Ollama backend unit running the real server on o's store; profiles
// rewrites the profiles of the config text.
func startRealOllamaE2E(t *testing.T, o realOllama, profiles func(string) string) *e2e {
	t.Helper()
	return startE2EWith(t, "10ms", o.state, func(y string) string {
		i := strings.Index(y, "  ollama:\n")
		j := strings.Index(y, "switch:\n")
		// The real server writes its model store and ~/.ollama below
		// state: the unit's sandbox must let it (read_write_paths).
		y = y[:i] + "  ollama:\n    exec: [" + o.bin + "]\n    user: root\n    read_write_paths: [" + o.state + "]\n" + y[j:]
		return profiles(y)
	}, map[string]string{
		"gpuhost-ollama.service.d/test.conf": "[Service]\nEnvironment=OLLAMA_MODELS=" + o.models + " HOME=" + o.home + "\n",
	})
}
