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
	"gpuhost/internal/testkit/browser"
	"gpuhost/units"
)

// TestSwitchToRealOllama runs the Ollama profile's unit, under the private
// systemd, as the real `ollama serve` (built from the Go module proxy) with
// a tiny model the project generates: the Supervisor's Ollama path
// (readiness, model load, /api/ps check) against the real thing.
func TestSwitchToRealOllama(t *testing.T) {
	o := prepareRealOllama(t)
	e := startRealOllamaE2E(t, o, func(y string) string {
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
	// The real server says the model is loaded, on the profile's port,
	// asked through the unit's socket (its port is in a private network).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ps struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := json.Unmarshal(realOllamaGet(t, ctx, e, "/api/ps"), &ps); err != nil || len(ps.Models) != 1 || ps.Models[0].Name != "tiny:latest" {
		t.Errorf("/api/ps of the real Ollama: %+v %v", ps, err)
	}
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
		// The daemon found the model where the unit's drop-in points
		// Ollama (OLLAMA_MODELS), not in root's home.
		if c.ID == CheckModelCache && c.Profile == "llama" && (c.Severity != "ok" || !strings.Contains(c.Message, "tiny is complete in root's cache: "+o.models)) {
			t.Errorf("profile.model_cache of the real Ollama: %+v", c)
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

// realOllamaGet GETs path from the llama profile's real Ollama through its
// unit's socket, from inside the private systemd (curl, as root).
func realOllamaGet(t *testing.T, ctx context.Context, e *e2e, path string) []byte {
	t.Helper()
	sock := units.ProxySocketPath(e.cfg.Backends.Ollama.Unit, e.cfg.Profiles["llama"].Port)
	out, err := e.sd.Command(ctx, "curl", "-sS", "--fail", "--max-time", "10", "--unix-socket", sock, "http://127.0.0.1"+path).Output()
	if err != nil {
		t.Fatalf("GET %s through %s: %v %s", path, sock, err, out)
	}
	return out
}

// TestBrowserCannotReachRealOllama: the real Ollama 0.17.4 allows every
// http://127.0.0.1:* origin, so on 119e2ce a page served from any other
// loopback port could delete its models or pull new ones. Under the
// private systemd, with the llama profile active, such a page and a
// file:// page try DELETE /api/delete (with CORS, which Ollama grants a
// loopback origin) and no-cors POSTs to /api/pull, /api/create and
// /api/generate:
// every request fails at the network, the model is still there, and /v1
// through gpuhost still answers.
func TestBrowserCannotReachRealOllama(t *testing.T) {
	bctx := browser.Start(t)
	e := startRealOllamaE2E(t, prepareRealOllama(t), func(y string) string {
		return strings.Replace(y, "model: llama3.1:8b", "model: tiny", 1)
	})
	e.switchTo(t, "llama")
	base := fmt.Sprintf("http://127.0.0.1:%d", e.cfg.Profiles["llama"].Port)
	page := attackPage([]attack{{"DELETE", base + "/api/delete", true}, {"POST", base + "/api/pull", false},
		{"POST", base + "/api/create", false}, {"POST", base + "/api/generate", false}})
	for _, url := range attackPages(t, page) {
		got := runAttack(t, bctx, url)
		t.Logf("page %s: %s", url, got)
		if got != "rejected,rejected,rejected,rejected" {
			t.Errorf("page %s reached the real Ollama: outcomes %q, want every request rejected", url, got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if tags := string(realOllamaGet(t, ctx, e, "/api/tags")); !strings.Contains(tags, `"tiny:latest"`) {
		t.Errorf("the real Ollama's models after the pages: %s, want tiny:latest still there", tags)
	}
	e.backendOnlyThroughGpuhost(t, "llama")
}
