package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"github.com/spf13/cobra"
)

// demoClientConfig: against the demo daemon, client-config writes Claude
// Code's settings env block and Codex's provider into existing files
// without losing their keys (backups kept), leaves out the models without
// tool calls, and what it wrote works: a Messages turn to the base URL and
// model it wrote, a Responses turn to the provider's base URL.
func demoClientConfig(t *testing.T, url string) {
	t.Helper()
	home := t.TempDir()
	env := []string{envDaemonURL + "=" + url, "HOME=" + home, "XDG_CONFIG_HOME=", "CODEX_HOME=", "CLAUDE_CONFIG_DIR="}

	// Without --write each prints its config and says that nothing was
	// written and where --write would merge it.
	for client, where := range map[string]string{
		"opencode":    filepath.Join(home, ".config", "opencode", "opencode.json"),
		"claude-code": filepath.Join(home, ".claude", "settings.json"),
		"codex":       filepath.Join(home, ".codex", "config.toml"),
	} {
		out, errOut, code := gpuhostEnv(t, env, "client-config", client)
		if code != 0 || out == "" || !strings.Contains(errOut, "printed only, nothing was written; gpuhost client-config "+client+" --write merges it into "+where) {
			t.Errorf("client-config %s without --write: exit %d\n%s%s", client, code, out, errOut)
		}
		if _, err := os.Stat(where); err == nil {
			t.Errorf("client-config %s without --write wrote %s", client, where)
		}
	}

	settings := filepath.Join(home, ".claude", "settings.json")
	if err := os.MkdirAll(filepath.Dir(settings), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(settings, []byte(`{"theme":"dark","env":{"FOO":"bar"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := gpuhostEnv(t, env, "client-config", "claude-code", "--write")
	if code != 0 || !strings.Contains(out, "previous file: "+settings+".bak.") || !strings.Contains(errOut, "gemma3-27b (profile gemma3-27b) left out: no tool calling") {
		t.Fatalf("client-config claude-code --write: exit %d\n%s%s", code, out, errOut)
	}
	var doc struct {
		Theme string
		Env   map[string]string
	}
	data, _ := os.ReadFile(settings)
	if err := json.Unmarshal(data, &doc); err != nil || doc.Theme != "dark" || doc.Env["FOO"] != "bar" ||
		doc.Env["ANTHROPIC_BASE_URL"] != url || doc.Env["ANTHROPIC_MODEL"] != "qwen3-coder" || doc.Env["ANTHROPIC_AUTH_TOKEN"] == "" {
		t.Fatalf("settings after --write: %s", data)
	}
	if fi, err := os.Stat(settings); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("settings mode changed: %v %v", fi.Mode(), err)
	}
	if out, _, _ := gpuhostEnv(t, env, "client-config", "claude-code", "--write"); !strings.Contains(out, "is up to date") {
		t.Errorf("second --write: %s", out)
	}
	msg := `{"model":"` + doc.Env["ANTHROPIC_MODEL"] + `","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	if body := postJSON(t, doc.Env["ANTHROPIC_BASE_URL"]+"/v1/messages", msg); !strings.Contains(body, `"type":"message"`) {
		t.Errorf("a Messages turn with the written settings: %s", body)
	}

	codex := filepath.Join(home, ".codex", "config.toml")
	if err := os.MkdirAll(filepath.Dir(codex), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(codex, []byte("approval_policy = \"never\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = gpuhostEnv(t, env, "client-config", "codex", "--write")
	var cfg struct {
		Model          string `toml:"model"`
		ModelProvider  string `toml:"model_provider"`
		ApprovalPolicy string `toml:"approval_policy"`
		ModelProviders map[string]struct {
			BaseURL string `toml:"base_url"`
			WireAPI string `toml:"wire_api"`
		} `toml:"model_providers"`
	}
	data, _ = os.ReadFile(codex)
	if code != 0 || toml.Unmarshal(data, &cfg) != nil || cfg.ApprovalPolicy != "never" || cfg.ModelProvider != "gpuhost" || cfg.Model != "qwen3-coder" ||
		cfg.ModelProviders["gpuhost"].WireAPI != "responses" || cfg.ModelProviders["gpuhost"].BaseURL != url+"/v1" {
		t.Fatalf("client-config codex --write: exit %d\n%s%s\n%s", code, out, errOut, data)
	}
	resp := `{"model":"` + cfg.Model + `","max_output_tokens":4,"input":"hi"}`
	if body := postJSON(t, cfg.ModelProviders["gpuhost"].BaseURL+"/responses", resp); !strings.Contains(body, `"object":"response"`) {
		t.Errorf("a Responses turn with the written provider: %s", body)
	}

	a, _, _ := gpuhostEnv(t, env, "opencode-config")
	b, _, code := gpuhostEnv(t, env, "client-config", "opencode")
	if code != 0 || a != b || a == "" {
		t.Errorf("client-config opencode differs from opencode-config:\n%s\n%s", a, b)
	}
	if _, errOut, code := gpuhostEnv(t, env, "client-config", "cursor"); code != 64 || !strings.Contains(errOut, `unknown client "cursor"`) {
		t.Errorf("unknown client: exit %d, want 64 (usage) %s", code, errOut)
	}
}

func postJSON(t *testing.T, url, body string) string {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}

// TestWriteMergedKeepsFileAndBackups: --write refuses a symlinked target
// (it would rewrite whatever file the link names), keeps the file's mode
// and owner, and saves each replaced version under its own timestamped
// backup, so the user's first one is never overwritten.
func TestWriteMergedKeepsFileAndBackups(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "opencode.json")
	if err := os.WriteFile(path, []byte("original"), 0o600); err != nil {
		t.Fatal(err)
	}
	asRoot := os.Geteuid() == 0
	if asRoot {
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	cmd := &cobra.Command{}
	cmd.SetOut(io.Discard)
	write := func(p, content string) error {
		return writeMerged(cmd, "test", p, "x", func([]byte) ([]byte, error) { return []byte(content), nil })
	}
	for _, content := range []string{"second", "third"} {
		if err := write(path, content); err != nil {
			t.Fatal(err)
		}
	}
	baks, _ := filepath.Glob(path + ".bak.*")
	var got []string
	for _, b := range baks {
		data, _ := os.ReadFile(b)
		got = append(got, string(data))
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"original", "second"}) {
		t.Errorf("backups %v hold %q, want the original and the second version", baks, got)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode after --write: %v %v", fi, err)
	}
	if st := fi.Sys().(*syscall.Stat_t); asRoot && (st.Uid != 65534 || st.Gid != 65534) {
		t.Errorf("owner after --write by root: %d:%d, want 65534:65534", st.Uid, st.Gid)
	}

	if asRoot {
		userDir := filepath.Join(dir, "home")
		if err := os.Mkdir(userDir, 0o755); err != nil || os.Chown(userDir, 65534, 65534) != nil {
			t.Fatal("make a user's folder")
		}
		fresh := filepath.Join(userDir, "new.json")
		if err := write(fresh, "{}"); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(fresh); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 65534 {
			t.Errorf("a new file in a user's folder, written by root, is not the user's: %v", err)
		}
	}

	secret := filepath.Join(dir, "other.json")
	if err := os.WriteFile(secret, []byte(`{"mine":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	err = write(link, "overwritten")
	if data, _ := os.ReadFile(secret); err == nil || !strings.Contains(err.Error(), "symbolic link") || string(data) != `{"mine":1}` {
		t.Errorf("--write through a symlink: err %v, target now %q", err, data)
	}
	if exitCodeOf(err) != exitUsage {
		t.Errorf("symlink refusal exits %d, want %d", exitCodeOf(err), exitUsage)
	}
	if m, _ := filepath.Glob(secret + ".bak*"); len(m) != 0 {
		t.Errorf("a backup was written beside the link's target: %v", m)
	}
}
