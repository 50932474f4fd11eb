package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/bench"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
	"gpuhost/triage"
)

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpuhost-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "gpuhost")
	if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build gpuhost: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func gpuhost(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func TestBadConfigNamesKeyAndExits78(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("profiles:\n  a:\n    backend: vllm\n    model: m\n    port: 8000\n    vllm:\n      max_num_seq: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := gpuhost(t, "serve", "--config", bad)
	if code != 78 || !strings.Contains(out, bad) || !strings.Contains(out, "profiles.a.vllm.max_num_seq") {
		t.Errorf("exit %d, output %q", code, out)
	}
	out, code = gpuhost(t, "doctor", "--config", filepath.Join(t.TempDir(), "none.yaml"))
	if code != 78 || !strings.Contains(out, "none.yaml") {
		t.Errorf("missing config: exit %d, %q", code, out)
	}
}

func TestUnitsRender(t *testing.T) {
	out, code := gpuhost(t, "units", "render", "--config", "config/gpuhost.example.yaml")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, w := range []string{"# ===== gpuhost.service =====", "Type=notify", "WatchdogSec=", "# ===== gpuhost-vllm.service =====",
		"Conflicts=gpuhost-ollama.service", "Conflicts=gpuhost-vllm.service", "$GPUHOST_ARGS"} {
		if !strings.Contains(out, w) {
			t.Errorf("render lacks %q", w)
		}
	}
	dir := t.TempDir()
	out, code = gpuhost(t, "units", "render", "--adopt", "--config", "config/gpuhost.example.yaml", "--dir", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	drop, err := os.ReadFile(filepath.Join(dir, "gpuhost-ollama.service.d", "10-gpuhost.conf"))
	if err != nil || !strings.Contains(string(drop), "Conflicts=gpuhost-vllm.service") {
		t.Errorf("adopt drop-in: %q %v", drop, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "gpuhost-ollama.service")); err == nil {
		t.Error("adopt mode must not write a unit file over the operator's")
	}
}

// TestDemo runs `gpuhost demo` as a user would: it comes up on the
// embedded default, a switch from the CLI shows VRAM released and taken
// again, and Ctrl-C leaves no backend behind.
func TestDemo(t *testing.T) {
	addr := testkit.FreeAddr(t)
	state := t.TempDir()
	cmd := exec.Command(binPath, "demo", "--listen", addr, "--state-dir", state)
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	var banner []string
	for sc.Scan() {
		banner = append(banner, sc.Text())
		if strings.Contains(sc.Text(), "Stop with Ctrl-C") {
			break
		}
	}
	var consoleMu sync.Mutex
	var console strings.Builder // what the demo prints after the banner (triage posts)
	go func() {
		for sc.Scan() {
			consoleMu.Lock()
			console.WriteString(sc.Text() + "\n")
			consoleMu.Unlock()
		}
	}()
	text := strings.Join(banner, "\n")
	url := "http://" + addr
	if !strings.Contains(text, url+"/api/status") || !strings.Contains(text, "export GPUHOST_URL="+url+"\n") || !strings.Contains(text, "gpuhost switch llama3-8b") {
		t.Fatalf("banner lacks URLs or example commands:\n%s", text)
	}
	// The demo restores its default profile.
	c := api.NewClient(url, "")
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := c.Status(context.Background())
		if err == nil && st.State.Phase == api.PhaseActive && st.State.Profile == "qwen3-coder" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo did not activate qwen3-coder: %+v %v", st.State, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The triage worker works through the sample mailbox on the simulated
	// model: rules, unsubscribe links and the voice memo's transcript.
	demoTriage(t, url)
	demoCLIWithoutConfig(t, url)
	demoClientConfig(t, url)
	consoleMu.Lock()
	printed := console.String()
	consoleMu.Unlock()
	// The triage worker waits for the default profile instead of failing
	// its first polls while it loads.
	for _, line := range strings.Split(text+"\n"+printed, "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("the demo logged an error on its way up: %s", line)
		}
	}
	if !strings.Contains(printed, "November newsletter") || !strings.Contains(printed, "https://news.toolvendor.example/u/4711?list=weekly&sig=Zm9v%2Bbar") {
		t.Errorf("the demo's console sink did not print the newsletter post:\n%s", printed)
	}
	// The agent loop: one question, a tool call through MCP, a prose answer.
	out, code := gpuhost(t, "ask", "--json", "--url", url, "what is the GPU status?")
	if code != 0 || !strings.Contains(out, `"kind":"tool_call"`) || !strings.Contains(out, `"tool":"gpu_status"`) || !strings.Contains(out, `"reason":"answer"`) {
		t.Errorf("gpuhost ask: exit %d\n%s", code, out)
	}

	out, code = gpuhost(t, "switch", "llama3-8b", "--url", url)
	if code != 0 {
		t.Fatalf("switch exit %d:\n%s", code, out)
	}
	// The demo's profiles use standby: qwen3-coder sleeps (its unit stays
	// up) and holds only its residual while llama3-8b runs.
	for _, w := range []string{"sleep level 1: 14.2 GiB of weights", "qwen3-coder in standby (sleep1): 512 MiB held", "VRAM released: 530 MiB used of 24564",
		"load_model", "VRAM 6.6/24.0 GiB", "llama3-8b is active"} {
		if !strings.Contains(out, w) {
			t.Errorf("switch output lacks %q:\n%s", w, out)
		}
	}
	// The way back wakes it instead of a cold start, and llama3-8b unloads.
	for _, sw := range []struct{ to, wants, without string }{
		{"qwen3-coder", "woke from level 1", "✓ start"},
		{"llama3-8b", "loaded llama3.1:8b", "✓ start"},
	} {
		out, code = gpuhost(t, "switch", sw.to, "--url", url)
		if code != 0 || !strings.Contains(out, sw.wants) || strings.Contains(out, sw.without) || !strings.Contains(out, "✓ wake") {
			t.Errorf("switch %s from standby: exit %d, want a wake (%q) and no start:\n%s", sw.to, code, sw.wants, out)
		}
	}
	out, code = gpuhost(t, "status", "--json", "--url", url)
	var st api.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.State.Profile != "llama3-8b" {
		t.Errorf("status --json: exit %d %s", code, out)
	}
	// The front doors on the same port: /v1 (streamed through to the
	// active backend), /metrics and the panel.
	body := `{"model":"llama3.1:8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	stream, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(stream), "data: [DONE]") || !strings.Contains(string(stream), `"completion_tokens":8`) {
		t.Errorf("/v1 stream: %d %s", resp.StatusCode, stream)
	}
	for path, want := range map[string]string{"/metrics": "DCGM_FI_DEV_FB_USED", "/": "llama3-8b", "/v1/models": `"llama3.1:8b"`} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d, lacks %q", path, resp.StatusCode, want)
		}
	}
	out, code = gpuhost(t, "switch", "nope", "--url", url)
	if code != 64 || !strings.Contains(out, "gemma3-27b, llama3-8b, qwen3-coder") {
		t.Errorf("unknown profile: exit %d %s", code, out)
	}
	out, code = gpuhost(t, "doctor", "--url", url, "--json")
	var rep api.DoctorReport
	// A serving demo has no failed check: the doctor exits 0 (warnings
	// included), written here rather than derived by the code under test.
	if json.Unmarshal([]byte(out), &rep) != nil || code != 0 || rep.Worst == "fail" || len(rep.Checks) == 0 {
		t.Errorf("doctor: exit %d, want 0; report %s", code, out)
	}

	// bench switch finds the daemon by $GPUHOST_URL, makes qwen3-coder
	// active first and measures both ways on the switch path; the demo's
	// proxy.auto_switch is off, so the request path is skipped. Both
	// profiles are in standby by now: both directions are wakes.
	benchDir := t.TempDir()
	out, errOut, code := gpuhostEnv(t, []string{envDaemonURL + "=" + url}, "bench", "switch", "qwen3-coder", "llama3-8b", "--rounds", "1", "--json", "--dir", benchDir)
	var br bench.Result
	if err := json.Unmarshal([]byte(out), &br); code != 0 || err != nil || br.Switch == nil || len(br.Switch.Samples) != 2 ||
		br.Switch.RequestPath != bench.RequestPathSkipped || br.Switch.Samples[0].To != "llama3-8b" || br.Switch.Samples[0].Mode != bench.ModeStandby || br.Switch.Samples[1].Mode != bench.ModeStandby {
		t.Errorf("bench switch: exit %d %v\n%s%s", code, err, out, errOut)
	}
	if stored, _ := filepath.Glob(filepath.Join(benchDir, "*-switch-qwen3-coder-llama3-8b.json")); len(stored) != 1 {
		t.Errorf("bench switch stored %q", stored)
	}

	// Ctrl-C: the demo stops its backends; their VRAM claims go away.
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("demo exit after SIGINT: %v", err)
	}
	claims, err := nvml.ReadClaims(filepath.Join(state, "simgpu"))
	if err != nil || len(claims) != 0 {
		t.Errorf("backends left after the demo ended: %+v %v", claims, err)
	}
}

// TestDaemonStaysUpWithoutDBusAndNVML: D-Bus unreachable and NVML missing
// are clear errors in the API, and the daemon keeps serving.
func TestDaemonStaysUpWithoutDBusAndNVML(t *testing.T) {
	dir := t.TempDir()
	addr := testkit.FreeAddr(t)
	cfg := fmt.Sprintf(`listen: %s
state_dir: %s
gpu: {backend: nvml}
systemd: {socket: %s/no-such-systemd/private}
profiles:
  p1: {backend: ollama, model: "llama3.1:8b", port: 18555}
`, addr, dir, dir)
	path := filepath.Join(dir, "gpuhost.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, "serve", "--config", path)
	var logs testkit.SyncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	c := api.NewClient("http://"+addr, "")
	var st api.Status
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		// The daemon answers at once; the failed reconciliation follows.
		if st, err = c.Status(context.Background()); err == nil && st.State.Phase == api.PhaseFailed {
			break
		}
	}
	if err != nil {
		t.Fatalf("daemon did not answer: %v\n%s", err, logs.String())
	}
	if st.GPU != nil || !strings.Contains(st.GPUError, "NVML") {
		t.Errorf("status GPU error = %q", st.GPUError)
	}
	if st.State.Phase != api.PhaseFailed || !strings.Contains(st.State.Error, "no-such-systemd/private") {
		t.Errorf("state = %+v, want failed naming the socket", st.State)
	}
	_, err = c.Switch(context.Background(), api.SwitchRequest{Profile: "p1", Force: true, Wait: true})
	if err == nil || !strings.Contains(err.Error(), "no-such-systemd/private") {
		t.Errorf("switch without D-Bus: %v", err)
	}
	if _, err := c.Status(context.Background()); err != nil {
		t.Errorf("daemon died after the failed switch: %v", err)
	}
	if cmd.ProcessState != nil {
		t.Error("daemon exited")
	}
	// After a few failed attempts the log says what it means and how to run
	// without systemd, and the daemon goes on retrying.
	hint := "systemd is not reachable at " + dir + "/no-such-systemd/private"
	testkit.Eventually(t, 60*time.Second, func() bool { return strings.Contains(logs.String(), hint) }, "the systemd-unreachable hint in the log")
	if l := logs.String(); !strings.Contains(l, "keeps retrying") || !strings.Contains(l, "gpuhost demo") {
		t.Errorf("the hint does not say it keeps retrying and how to run without systemd:\n%s", l)
	}
	if _, err := c.Status(context.Background()); err != nil {
		t.Errorf("daemon died after the hint: %v", err)
	}
}

// demoTriage waits for the demo's six sample mails in GET /api/triage and
// checks what each one stands for.
func demoTriage(t *testing.T, url string) {
	t.Helper()
	var resp triage.APIResponse
	deadline := time.Now().Add(90 * time.Second)
	for {
		r, err := http.Get(url + "/api/triage")
		if err == nil {
			err = json.NewDecoder(r.Body).Decode(&resp)
			r.Body.Close()
		}
		if err == nil && len(resp.Results) >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo triage: %d results after 90 s (err %v, state %+v)", len(resp.Results), err, resp.State)
		}
		time.Sleep(250 * time.Millisecond)
	}
	bySubject := map[string]triage.Result{}
	for _, r := range resp.Results {
		bySubject[r.Subject] = r
	}
	if r := bySubject["November newsletter: 10 tips for faster builds"]; r.Unsubscribe.URL != "https://news.toolvendor.example/u/4711?list=weekly&sig=Zm9v%2Bbar" || !r.Unsubscribe.OneClick || r.Unsubscribe.Source != "header" {
		t.Errorf("newsletter unsubscribe = %+v", r.Unsubscribe)
	}
	if r := bySubject["Black Week: 30 % auf Druckerpapier"]; r.Unsubscribe.Source != "html" || !strings.Contains(r.Unsubscribe.URL, "/newsletter/abmelden?id=8812") {
		t.Errorf("HTML-only newsletter unsubscribe = %+v", r.Unsubscribe)
	}
	if r := bySubject["Planned maintenance on rack B4 tonight"]; r.Importance != 10 || !strings.Contains(r.Rule, "priority") {
		t.Errorf("priority mailbox: importance %d rule %q", r.Importance, r.Rule)
	}
	if r := bySubject["Lunch order for Friday"]; r.Importance != 1 || !strings.Contains(r.Rule, "internal") {
		t.Errorf("internal sender: importance %d rule %q", r.Importance, r.Rule)
	}
	if r := bySubject["Voice message"]; len(r.Transcribed) != 1 || r.Cost.AudioSeconds <= 0 {
		t.Errorf("voice memo: transcribed %v, audio seconds %v, note %q", r.Transcribed, r.Cost.AudioSeconds, r.TranscriptNote)
	}
	if resp.State.Checkpoint.LastUID != 6 {
		t.Errorf("checkpoint = %+v, want last_uid 6", resp.State.Checkpoint)
	}
	// serve hands the worker to the panel: its Mail page shows the same.
	r, err := http.Get(url + "/mail")
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("GET /mail: %d, %v", r.StatusCode, err)
	}
	for _, want := range []string{"Planned maintenance on rack B4 tonight", `<dd id="cp-last-uid">6</dd>`, `href="https://news.toolvendor.example/u/4711?list=weekly&amp;sig=Zm9v%2Bbar"`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the demo's Mail page lacks %q", want)
		}
	}
}

// TestTwoDemosSideBySide: a second demo with its own state directory and
// listen address finds the first one's backend ports taken and uses free
// ones. Before, its switch was declared active on the strength of the
// first demo's simulator answering on the shared port, while its own
// backend had failed to bind.
func TestTwoDemosSideBySide(t *testing.T) {
	type demo struct {
		url string
		out *testkit.SyncBuffer
	}
	start := func() demo {
		addr := testkit.FreeAddr(t)
		cmd := exec.Command(binPath, "demo", "--listen", addr, "--state-dir", t.TempDir())
		out := &testkit.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGINT); _ = cmd.Wait() })
		return demo{url: "http://" + addr, out: out}
	}
	active := func(d demo) api.Status {
		c := api.NewClient(d.url, "")
		deadline := time.Now().Add(60 * time.Second)
		for {
			st, err := c.Status(context.Background())
			if err == nil && st.State.Phase == api.PhaseActive && st.State.Profile == "qwen3-coder" && st.State.Step == "" {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("demo at %s did not activate qwen3-coder: %+v %v\n%s", d.url, st.State, err, d.out.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	port := func(st api.Status) int {
		for _, p := range st.Profiles {
			if p.Name == "qwen3-coder" {
				return p.Port
			}
		}
		return 0
	}
	a := start()
	stA := active(a)
	b := start()
	stB := active(b)
	if port(stA) == port(stB) {
		t.Fatalf("both demos use port %d for qwen3-coder", port(stA))
	}
	// A moved port is logged with the configured one it replaces (18000:
	// taken by the first demo, or by anything else on a busy machine, in
	// which case the first demo moved too).
	if port(stB) != 18000 && !strings.Contains(b.out.String(), "busy_port=18000") {
		t.Errorf("the second demo moved qwen3-coder to %d but does not say which port was taken:\n%s", port(stB), b.out.String())
	}
	// Each demo's own backend runs and stays running.
	for _, st := range []api.Status{stA, stB} {
		for _, u := range st.Units {
			if u.Name == "gpuhost-vllm.service" && (u.ActiveState != "active" || u.MainPID == 0) {
				t.Errorf("vLLM unit %+v, want active", u)
			}
		}
	}
}
