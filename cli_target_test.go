package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/bench"
	"gpuhost/config"
	"gpuhost/internal/sse"
	"gpuhost/triage"
	"gpuhost/triage/demo"
)

// TestResolveDaemon: --url, else $GPUHOST_URL, else the config's listen
// (only when the config is readable), else the default; the origin names
// what was tried.
func TestResolveDaemon(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "gpuhost.yaml")
	example, err := os.ReadFile("config/gpuhost.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, example, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfgURL := "http://" + strings.Replace(cfg.Listen, "0.0.0.0", "127.0.0.1", 1)
	missing := filepath.Join(dir, "missing.yaml")
	tests := []struct {
		name       string
		args       []string
		env        string
		defaultCfg string // config.DefaultPath stand-in
		wantURL    string
		wantOrigin []string
		wantErr    string
	}{
		{name: "--url wins", args: []string{"--url", "http://a:1"}, env: "http://b:2", defaultCfg: cfgPath, wantURL: "http://a:1", wantOrigin: []string{"--url"}},
		{name: "env over config", env: "http://b:2", defaultCfg: cfgPath, wantURL: "http://b:2", wantOrigin: []string{"$GPUHOST_URL"}},
		{name: "config listen", defaultCfg: cfgPath, wantURL: cfgURL, wantOrigin: []string{"listen in " + cfgPath}},
		{name: "explicit config", args: []string{"--config", cfgPath}, defaultCfg: missing, wantURL: cfgURL},
		{name: "nothing: the default, saying what was tried", defaultCfg: missing, wantURL: DefaultDaemonURL,
			wantOrigin: []string{"the default", "--url (not given)", "$GPUHOST_URL (not set)", "config " + missing + " (not there)"}},
		{name: "env without config", env: "http://b:2", defaultCfg: missing, wantURL: "http://b:2"},
		{name: "explicit config missing is an error", args: []string{"--config", missing}, env: "http://b:2", wantErr: missing},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envDaemonURL, tc.env)
			cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
			cmd.Flags().String("config", "", "")
			urlFlag(cmd)
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			if tc.defaultCfg != "" && !cmd.Flags().Changed("config") {
				// The default path is the machine's; point it at the case's.
				defaultConfigPath = tc.defaultCfg
				t.Cleanup(func() { defaultConfigPath = config.DefaultPath })
			}
			got, err := resolveDaemon(cmd)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.URL != tc.wantURL {
				t.Errorf("URL %q, want %q (origin %q)", got.URL, tc.wantURL, got.Origin)
			}
			for _, w := range tc.wantOrigin {
				if !strings.Contains(got.Origin, w) {
					t.Errorf("origin %q lacks %q", got.Origin, w)
				}
			}
		})
	}
}

// gpuhostEnv runs the binary with extra environment, without a config
// file, and returns stdout and stderr apart.
func gpuhostEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// demoCLIWithoutConfig: after `gpuhost demo`, with GPUHOST_URL exported as
// its banner says and no config file, the commands that talk to a box find
// the daemon; opencode-config lists only the models opencode can use and
// merges into an existing opencode.json without losing anything.
func demoCLIWithoutConfig(t *testing.T, url string) {
	t.Helper()
	home := t.TempDir()
	env := []string{envDaemonURL + "=" + url, "HOME=" + home, "XDG_CONFIG_HOME="}

	out, errOut, code := gpuhostEnv(t, env, "status")
	if code != 0 || !strings.Contains(out, "active: qwen3-coder") {
		t.Errorf("status via $GPUHOST_URL: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = gpuhostEnv(t, env, "doctor", "--json")
	var rep api.DoctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || rep.Worst == "fail" || len(rep.Checks) == 0 {
		t.Errorf("doctor via $GPUHOST_URL: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	// The daemon's own tools over /mcp, no second supervisor, no config.
	out, errOut, code = gpuhostEnv(t, env, "mcp", "tools")
	if code != 0 || !strings.Contains(out, "gpu_status") || !strings.Contains(out, "inference_doctor") || !strings.Contains(out, "schema: {") {
		t.Errorf("mcp tools from the daemon: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = gpuhostEnv(t, env, "mcp", "tools", "--json")
	var tools struct {
		Tools []struct{ Name string } `json:"tools"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &tools) != nil || len(tools.Tools) == 0 {
		t.Errorf("mcp tools --json: exit %d\n%s%s", code, out, errOut)
	}

	// opencode-config: only qwen3-coder is usable; the others are named
	// on stderr with the profile fix.
	out, errOut, code = gpuhostEnv(t, env, "opencode-config")
	var doc struct {
		Provider map[string]struct {
			Options struct {
				BaseURL string  `json:"baseURL"`
				APIKey  *string `json:"apiKey"`
			} `json:"options"`
			Models map[string]struct {
				Limit    struct{ Context, Output int } `json:"limit"`
				ToolCall bool                          `json:"tool_call"`
			} `json:"models"`
		} `json:"provider"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("opencode-config: exit %d\n%s%s", code, out, errOut)
	}
	p := doc.Provider["gpuhost"]
	if p.Options.BaseURL != url+"/v1" || p.Options.APIKey != nil || len(p.Models) != 1 {
		t.Errorf("opencode-config provider: %+v", p)
	}
	if m := p.Models["qwen3-coder"]; m.Limit.Context != 32768 || m.Limit.Output != 8192 || !m.ToolCall {
		t.Errorf("qwen3-coder = %+v", m)
	}
	for _, w := range []string{"gemma3-27b (profile gemma3-27b) left out: no tool calling", "vllm.enable_auto_tool_choice: true",
		"llama3.1:8b (profile llama3-8b) left out: context 8192 tokens is below 16384", "ollama.num_ctx to at least 16384"} {
		if !strings.Contains(errOut, w) {
			t.Errorf("opencode-config stderr lacks %q:\n%s", w, errOut)
		}
	}
	out, _, code = gpuhostEnv(t, env, "opencode-config", "--min-context", "8192")
	if code != 0 || !strings.Contains(out, `"llama3.1:8b": {`) || strings.Contains(out, `"gemma3-27b": {`) {
		t.Errorf("--min-context 8192: exit %d\n%s", code, out)
	}

	// --write merges into an existing file: other keys kept, backup made.
	path := filepath.Join(home, "oc", "opencode.json")
	orig := `{"theme":"tokyonight","provider":{"anthropic":{"options":{"apiKey":"{env:ANTHROPIC_API_KEY}"}}}}`
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(orig), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = gpuhostEnv(t, env, "opencode-config", "--write", path)
	merged, _ := os.ReadFile(path)
	baks, _ := filepath.Glob(path + ".bak.*")
	var bak []byte
	if len(baks) == 1 {
		bak, _ = os.ReadFile(baks[0])
	}
	var m map[string]any
	if code != 0 || json.Unmarshal(merged, &m) != nil || m["theme"] != "tokyonight" || string(bak) != orig {
		t.Fatalf("--write PATH: exit %d\n%s%s\nfile:\n%s\nbak:\n%s", code, out, errOut, merged, bak)
	}
	provs := m["provider"].(map[string]any)
	if provs["anthropic"] == nil || provs["gpuhost"] == nil {
		t.Errorf("--write: providers %v", provs)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("--write changed the file mode: %v %v", fi.Mode(), err)
	}
	// No daemon: nothing is written, the file keeps every byte.
	bad := []string{envDaemonURL + "=http://127.0.0.1:1", "HOME=" + home, "XDG_CONFIG_HOME="}
	_, errOut, code = gpuhostEnv(t, bad, "opencode-config", "--write", path)
	after, _ := os.ReadFile(path)
	if code == 0 || !bytes.Equal(after, merged) || !strings.Contains(errOut, "from $GPUHOST_URL") {
		t.Errorf("--write without a daemon: exit %d, file changed %v\n%s", code, !bytes.Equal(after, merged), errOut)
	}
	// A file with comments is not merged and not touched.
	commented := "{\n  // mine\n  \"theme\": \"x\"\n}\n"
	os.WriteFile(path, []byte(commented), 0o600)
	_, errOut, code = gpuhostEnv(t, env, "opencode-config", "--write", path)
	after, _ = os.ReadFile(path)
	if code == 0 || string(after) != commented || !strings.Contains(errOut, "not a plain JSON object") {
		t.Errorf("--write over a commented file: exit %d\n%s\nfile:\n%s", code, errOut, after)
	}
	// --write without PATH: opencode's global config under $HOME.
	out, errOut, code = gpuhostEnv(t, env, "opencode-config", "--write")
	def := filepath.Join(home, ".config", "opencode", "opencode.json")
	if b, err := os.ReadFile(def); code != 0 || err != nil || !strings.Contains(string(b), `"qwen3-coder"`) {
		t.Errorf("--write to the default path: exit %d %v\n%s%s", code, err, out, errOut)
	}
	// A daemon that is not there: the error names where the URL came from.
	_, errOut, code = gpuhostEnv(t, bad, "status")
	if code != 69 || !strings.Contains(errOut, "reach gpuhost at http://127.0.0.1:1 (from $GPUHOST_URL)") {
		t.Errorf("status without a daemon: exit %d %s", code, errOut)
	}
	demoTriageWithoutConfig(t, url, env, bad)
	demoBenchWithoutConfig(t, env, bad, home)
}

// skipIfDefaultConfig: the no-config checks mean nothing on a machine
// with a config at the default path.
func skipIfDefaultConfig(t *testing.T) bool {
	t.Helper()
	if _, err := os.Stat(config.DefaultPath); err == nil {
		t.Logf("NOT CHECKED: the commands without a config (%s exists on this machine)", config.DefaultPath)
		return true
	}
	return false
}

// demoTriageWithoutConfig: `triage mail --eml` judges a mail through the
// daemon's /v1 and prints the post; the mailbox commands name the config
// they need and what the daemon's own worker does; no daemon, no mail.
func demoTriageWithoutConfig(t *testing.T, url string, env, bad []string) {
	t.Helper()
	if skipIfDefaultConfig(t) {
		return
	}
	_, raws, err := demo.Mails()
	if err != nil {
		t.Fatal(err)
	}
	eml := filepath.Join(t.TempDir(), "inquiry.eml")
	if err := os.WriteFile(eml, raws[0], 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := gpuhostEnv(t, env, "triage", "mail", "--eml", eml)
	if code != 0 || !strings.Contains(out, "Offer for 40 additional licences?") || !strings.Contains(out, "Class: customer") ||
		!strings.Contains(out, "Posted to: nowhere (no config file") ||
		!strings.Contains(errOut, "classifying on qwen3-coder at "+url+"/v1 (from $GPUHOST_URL) with the triage defaults") {
		t.Errorf("triage mail --eml without a config: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = gpuhostEnv(t, env, "triage", "mail", "--eml", eml, "--json")
	var res triage.Result
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res.Class != "customer" || len(res.Posted) != 0 || !strings.HasPrefix(res.Key, "manual/eml/") {
		t.Errorf("triage mail --eml --json without a config: exit %d %v\n%s%s", code, err, out, errOut)
	}
	for _, args := range [][]string{{"triage", "once"}, {"triage", "mail", "--uid", "1"}} {
		_, errOut, code = gpuhostEnv(t, env, args...)
		for _, w := range []string{"needs the mailbox of a config's triage: section", "tried --config (not given), " + config.DefaultPath + " (not there)",
			"the daemon at " + url + " (from $GPUHOST_URL) polls its own mailbox maildir:", "gpuhost triage mail --eml FILE"} {
			if code == 0 || !strings.Contains(errOut, w) {
				t.Errorf("%v without a config: exit %d, lacks %q:\n%s", args, code, w, errOut)
			}
		}
	}
	_, errOut, code = gpuhostEnv(t, bad, "triage", "mail", "--eml", eml)
	if code == 0 || !strings.Contains(errOut, "reach gpuhost at http://127.0.0.1:1 (from $GPUHOST_URL)") {
		t.Errorf("triage mail --eml without a daemon: exit %d %s", code, errOut)
	}
}

// demoBenchWithoutConfig: the default `bench run` measures the daemon's
// active profile, found by $GPUHOST_URL, and stores the result in the
// daemon's store; no daemon: the error names what was tried.
func demoBenchWithoutConfig(t *testing.T, env, bad []string, home string) {
	t.Helper()
	if skipIfDefaultConfig(t) {
		return
	}
	small := []string{"bench", "run", "--repeats", "1", "--prefill", "64", "--decode", "8", "--concurrency", "1", "--serving-requests", "1", "--json"}
	out, errOut, code := gpuhostEnv(t, append(env, "XDG_STATE_HOME="), small...)
	var r bench.Result
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.Status != bench.StatusOK || r.Fingerprint.Profile != "qwen3-coder" ||
		r.Fingerprint.Model != "qwen3-coder" || r.Fingerprint.Backend != "vllm" || r.Fingerprint.GPUBackend != "sim" {
		t.Errorf("bench run without a config: exit %d %v %+v\n%s", code, err, r.Fingerprint, errOut)
	}
	// The daemon hands over the profile's model_params: the roofline is drawn.
	if r.Roofline == nil || r.Roofline.ParamsB != 3.3 { // MoE: the 3.3B active parameters are read per token
		t.Errorf("bench run through the daemon has no roofline from the profile's model_params: %+v", r.Roofline)
	}
	// Through the daemon the result lands in the daemon's own store (the
	// panel's Bench page lists it), not under the user's state directory.
	if stored, _ := filepath.Glob(filepath.Join(home, ".local", "state", "gpuhost", "bench", "*.json")); len(stored) != 0 {
		t.Errorf("bench run through the daemon stored locally too: %q", stored)
	}
	var url string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, envDaemonURL+"="); ok {
			url = v
		}
	}
	resp, err := http.Get(url + "/api/bench")
	if err != nil {
		t.Fatal(err)
	}
	list, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(list), `"id":"`+r.ID+`"`) {
		t.Errorf("bench run without a config: %s is not in the daemon's results:\n%s\n%s", r.ID, list, errOut)
	}
	_, errOut, code = gpuhostEnv(t, bad, small...)
	if code == 0 || !strings.Contains(errOut, "reach gpuhost at http://127.0.0.1:1 (from $GPUHOST_URL)") || !strings.Contains(errOut, "not there") {
		t.Errorf("bench run without a daemon: exit %d %s", code, errOut)
	}
}

// TestSwitchCtrlC: Ctrl-C while following a switch says that the switch
// goes on in the daemon and how to follow it.
func TestSwitchCtrlC(t *testing.T) {
	streaming := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/switch":
			if r.Header.Get("Content-Type") != "application/json" {
				http.Error(w, "want JSON", http.StatusUnsupportedMediaType)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"switch_id":"sw-7","profile":"llama3-8b","events":"/api/events?since=3"}`)
		case "/api/events":
			_ = sse.NewWriter(w).Send(sse.Event{Data: []byte(`{"kind":"step","switch_id":"sw-7","step":"stop","status":"started","time":"2026-01-01T00:00:00Z"}`)})
			close(streaming)
			<-r.Context().Done() // the switch is still going
		}
	}))
	defer srv.Close()
	cmd := exec.Command(binPath, "switch", "llama3-8b", "--url", srv.URL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 256)
	n, _ := stdout.Read(line) // the first step is printed: it follows
	<-streaming
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 130 {
		t.Errorf("exit after Ctrl-C: %v", err)
	}
	for _, w := range []string{"the switch to llama3-8b goes on in the daemon (switch sw-7)", "gpuhost status --url " + srv.URL, srv.URL + "/api/events?since=3"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("Ctrl-C message lacks %q:\nstdout %s\nstderr %s", w, line[:n], stderr.String())
		}
	}
}
