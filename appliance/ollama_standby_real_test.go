package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
)

// TestRealOllamaStandby follows a standby round trip of the real Ollama
// (built from the Go module proxy, serving the tiny generated model) under
// the private systemd: switched away from, its model is unloaded and its
// unit keeps running; switched back to, the model is loaded into the same
// server process instead of the unit being started.
//
// coder (the simulated vLLM) has standby off: the subject here is the real
// Ollama, coder's sleep is the simulator's and TestStandbyRoundTrip covers
// it, and with coder off the way back is the mixed leg that test does not
// take: one backend stopped, the other woken.
func TestRealOllamaStandby(t *testing.T) {
	o := prepareRealOllama(t)
	e := startRealOllamaE2E(t, o, func(y string) string {
		return strings.Replace(y, "  llama:\n    backend: ollama\n    model: llama3.1:8b\n",
			"  tiny:\n    backend: ollama\n    model: tiny\n    standby: unload\n", 1)
	})
	ounit, vunit := e.cfg.Backends.Ollama.Unit, e.cfg.Backends.VLLM.Unit
	port := e.cfg.Profiles["tiny"].Port

	// Cold: the unit is started, the model loaded, and it answers.
	evs := e.switchTo(t, "tiny")
	if got := strings.Join(stepsOf(evs), " "); got != "vram_release configure start ready load_model verify wake_check" {
		t.Errorf("cold switch to tiny: steps %q%s", got, describe(evs))
	}
	if got := e.isActive(t, ounit); got != "active" {
		t.Fatalf("%s after the cold switch: %s", ounit, got)
	}
	pid := e.mainPID(t, ounit)
	if ps := realOllamaPS(t, e, port); len(ps) != 1 || ps[0].Name != "tiny:latest" {
		t.Fatalf("/api/ps after the cold switch: %+v", ps)
	}
	realOllamaGenerate(t, e, port, 8)
	// The real Ollama decodes on the CPU (it holds no memory in the
	// simulated GPU): its reference says so, and a slow answer on a busy
	// host is not held against it.
	if ref := readWakeRef(t, e, "tiny"); !ref.CPUOnly || ref.DecodeTPS <= 0 {
		t.Errorf("tiny's wake check reference: %+v, want cpu_only and a rate", ref)
	}
	cold := stepMS(evs, "start") + stepMS(evs, "ready") + stepMS(evs, "load_model")
	t.Logf("cold switch to tiny: start %.1f ms + ready %.1f ms + load_model %.1f ms = %.1f ms (switch %.1f ms)",
		stepMS(evs, "start"), stepMS(evs, "ready"), stepMS(evs, "load_model"), cold, switchMS(evs))

	// Away to coder: tiny's model is unloaded, its unit stays up.
	evs = e.switchTo(t, "coder")
	if got := strings.Join(stepsOf(evs), " "); got != "drain standby vram_release configure start ready verify wake_check" {
		t.Errorf("tiny → coder: steps %q%s", got, describe(evs))
	}
	if ev, ok := stepEvent(evs, "standby", "info"); !ok || ev.Detail["mode"] != "unload" {
		t.Errorf("tiny → coder: standby choice %+v, want mode unload%s", ev, describe(evs))
	}
	if ev, ok := stepEvent(evs, "standby", "done"); !ok || ev.Detail[ounit] != "unload" || !strings.Contains(ev.Message, "tiny in standby (unload)") {
		t.Errorf("tiny → coder: standby step %+v%s", ev, describe(evs))
	}
	// Read at once, without polling: the switch must have waited for the
	// unload itself, not only for Ollama's answer to it.
	if ps := realOllamaPS(t, e, port); len(ps) != 0 {
		t.Errorf("/api/ps of the Ollama in standby lists %+v, want no model", ps)
	}
	for unit, want := range map[string]string{ounit: "active", vunit: "active"} {
		if got := e.isActive(t, unit); got != want {
			t.Errorf("%s after tiny → coder: %s, want %s", unit, got, want)
		}
	}
	if got := e.mainPID(t, ounit); got != pid {
		t.Errorf("%s MainPID went from %d to %d on the way into standby", ounit, pid, got)
	}
	st := e.status(t)
	if st.State.Phase != api.PhaseActive || st.State.Profile != "coder" || len(st.State.Standby) != 1 ||
		st.State.Standby[0].Profile != "tiny" || st.State.Standby[0].Unit != ounit || st.State.Standby[0].Mode != "unload" {
		t.Fatalf("state after tiny → coder: %+v, want coder active and tiny in standby (unload)", st.State)
	}
	unload := stepMS(evs, "standby")
	// The doctor sees two units running, the real Ollama in standby within
	// its residual, and no fault.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := e.client.Doctor(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range rep.Checks {
		switch c.ID {
		case "units.exclusive", "standby.residual", "standby.exclusion", "units.conflicts":
			seen[c.ID] = true
			if c.Severity != "ok" {
				t.Errorf("doctor with tiny in standby: %s = %s: %s", c.ID, c.Severity, c.Message)
			}
		}
	}
	if !seen["units.exclusive"] || !seen["standby.residual"] {
		t.Errorf("doctor with tiny in standby lacks units.exclusive or standby.residual: %+v", rep.Checks)
	}

	// Back to tiny: coder is stopped (standby off), tiny is woken, not started.
	evs = e.switchTo(t, "tiny")
	if got := strings.Join(stepsOf(evs), " "); got != "drain stop vram_release wake ready verify wake_check" {
		t.Errorf("coder → tiny: steps %q, want a drain, a stop, the release of its memory, then a wake%s", got, describe(evs))
	}
	if _, ok := stepEvent(evs, "start", "started"); ok {
		t.Errorf("coder → tiny started the Ollama unit instead of waking it%s", describe(evs))
	}
	// The wake is Load: the real Ollama answers it done_reason "load".
	if ev, ok := stepEvent(evs, "wake", "done"); !ok || ev.Detail["mode"] != "unload" || !strings.Contains(ev.Message, `done_reason "load"`) {
		t.Errorf("coder → tiny: wake step %+v%s", ev, describe(evs))
	}
	if got := e.mainPID(t, ounit); got != pid {
		t.Errorf("%s MainPID went from %d to %d: restarted, not woken", ounit, pid, got)
	}
	if got := e.isActive(t, vunit); got != "inactive" {
		t.Errorf("%s after coder → tiny: %s, want inactive (standby off)", vunit, got)
	}
	if ps := realOllamaPS(t, e, port); len(ps) != 1 || ps[0].Name != "tiny:latest" {
		t.Errorf("/api/ps after the wake: %+v, want tiny:latest loaded", ps)
	}
	realOllamaGenerate(t, e, port, 8)
	st = e.status(t)
	if st.State.Phase != api.PhaseActive || st.State.Profile != "tiny" || len(st.State.Standby) != 0 {
		t.Errorf("state after coder → tiny: %+v, want tiny active and nothing in standby", st.State)
	}
	wake := stepMS(evs, "wake")
	t.Logf("unload (standby step) %.1f ms; release of the stopped coder %.1f ms; wake (load into the running server) %.1f ms + ready %.1f ms vs cold start+ready+load_model %.1f ms (%.1fx); switch back %.1f ms",
		unload, stepMS(evs, "vram_release"), wake, stepMS(evs, "ready"), cold, cold/max(wake, 0.001), switchMS(evs))
}

// readWakeRef is profile's wake check reference in the daemon's state.
func readWakeRef(t *testing.T, e *e2e, profile string) wakeRef {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.cfg.StateDir, "wake_check.json"))
	if err != nil {
		t.Fatal(err)
	}
	var refs map[string]wakeRef
	if err := json.Unmarshal(data, &refs); err != nil {
		t.Fatalf("wake_check.json: %v", err)
	}
	return refs[profile]
}

// mainPID is the unit's MainPID as systemd reports it.
func (e *e2e) mainPID(t *testing.T, unit string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := e.sd.Systemctl(ctx, "show", "-p", "MainPID", "--value", unit)
	if err != nil {
		t.Fatalf("MainPID of %s: %v %s", unit, err, out)
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(out), &pid); err != nil || pid == 0 {
		t.Fatalf("MainPID of %s: %q", unit, out)
	}
	return pid
}

func (e *e2e) status(t *testing.T) api.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// psModel is one model in the real Ollama's /api/ps.
type psModel struct {
	Name     string `json:"name"`
	SizeVRAM int64  `json:"size_vram"`
}

func realOllamaPS(t *testing.T, e *e2e, port int) []psModel {
	t.Helper()
	c := e.backendHTTP(10 * time.Second)
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/api/ps", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ps struct {
		Models []psModel `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		t.Fatalf("/api/ps: %v", err)
	}
	return ps.Models
}

// realOllamaGenerate asks the real Ollama for n tokens: the tiny model
// never stops on its own, so it answers exactly n, done_reason "length".
func realOllamaGenerate(t *testing.T, e *e2e, port, n int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "The quick brown fox", "stream": false,
		"options": map[string]any{"num_predict": n}})
	c := e.backendHTTP(60 * time.Second)
	resp, err := c.Post(fmt.Sprintf("http://127.0.0.1:%d/api/generate", port), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var g struct {
		Response   string `json:"response"`
		DoneReason string `json:"done_reason"`
		EvalCount  int    `json:"eval_count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&g); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("generate: %s %v", resp.Status, err)
	}
	if g.EvalCount != n || g.DoneReason != "length" || g.Response == "" {
		t.Errorf("generate %d tokens: eval_count %d, done_reason %q, response %q", n, g.EvalCount, g.DoneReason, g.Response)
	}
}

// stepMS is the duration of a switch's done step (0 when it has none).
func stepMS(evs []api.Event, step string) float64 {
	ev, _ := stepEvent(evs, step, "done")
	return ev.DurationMS
}

// switchMS is the duration of the whole switch.
func switchMS(evs []api.Event) float64 {
	for _, ev := range evs {
		if ev.Kind == "switch" && ev.Status == "done" {
			return ev.DurationMS
		}
	}
	return 0
}
