package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"gpuhost/config"
	"gpuhost/internal/testkit"
)

// leafCommands lists the path of every runnable command of the CLI.
func leafCommands(c *cobra.Command, prefix []string) [][]string {
	var out [][]string
	for _, sub := range c.Commands() {
		if sub.Name() == "help" || sub.Name() == "completion" {
			continue
		}
		path := append(append([]string{}, prefix...), sub.Name())
		if sub.Runnable() {
			out = append(out, path)
		}
		out = append(out, leafCommands(sub, path)...)
	}
	return out
}

// TestExitCodeContractUsage runs every command of the CLI, as a separate
// process, with a flag it does not have: each must exit 64 and name it.
func TestExitCodeContractUsage(t *testing.T) {
	leaves := leafCommands(newRootCmd(), nil)
	if len(leaves) < 25 {
		t.Fatalf("only %d commands found: the walk is broken", len(leaves))
	}
	for _, path := range leaves {
		args := append(append([]string{}, path...), "--no-such-flag")
		out, code := gpuhost(t, args...)
		if code != exitUsage || !strings.Contains(out, "no-such-flag") {
			t.Errorf("gpuhost %s: exit %d (want %d), output %q", strings.Join(args, " "), code, exitUsage, out)
		}
	}
	for _, args := range [][]string{
		{"no-such-command"},
		{"switch"},
		{"switch", "a", "b"},
		{"bench", "compare", "a"},
		{"bench", "run", "--repeats", "x"},
		{"status", "extra"},
	} {
		if out, code := gpuhost(t, args...); code != exitUsage {
			t.Errorf("gpuhost %s: exit %d (want %d), output %q", strings.Join(args, " "), code, exitUsage, out)
		}
	}
}

// TestExitCodeContract checks 69 (daemon unreachable), 78 (config error)
// and 1 (the doctor found a failure) across the commands that can end so,
// and that `gpuhost help exit-codes` states the contract.
func TestExitCodeContract(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("listen: 127.0.0.1:1\nprofiles:\n  a:\n    backend: vllm\n    model: m\n    port: 8000\n    vllm:\n      max_num_seq: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "none.yaml")
	eml := filepath.Join(dir, "m.eml")
	if err := os.WriteFile(eml, []byte("From: a@b.example\r\nSubject: hi\r\n\r\nhello\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	down := []string{"GPUHOST_URL=http://127.0.0.1:1", "HOME=" + dir}
	cases := []struct {
		env  []string
		args []string
		want int
	}{
		{down, []string{"status"}, exitUnavailable},
		{down, []string{"switch", "llama3-8b"}, exitUnavailable},
		{down, []string{"heal"}, exitUnavailable},
		{down, []string{"doctor"}, exitUnavailable},
		{down, []string{"ask", "what is the GPU status?"}, exitUnavailable},
		{down, []string{"mcp", "tools"}, exitUnavailable},
		{down, []string{"opencode-config"}, exitUnavailable},
		{down, []string{"triage", "mail", "--eml", eml}, exitUnavailable},
		{down, []string{"bench", "switch", "a", "b"}, exitUnavailable},
		{down, []string{"bench", "run", "--preflight-timeout", "2s"}, exitUnavailable},
		{nil, []string{"serve", "--config", bad}, exitConfig},
		{nil, []string{"serve", "--config", missing}, exitConfig},
		{nil, []string{"doctor", "--config", bad}, exitConfig},
		{nil, []string{"doctor", "--config", missing}, exitConfig},
		{nil, []string{"status", "--config", bad}, exitConfig},
		{nil, []string{"units", "render", "--config", bad}, exitConfig},
		{nil, []string{"pair", "list", "--config", missing}, exitConfig},
		{nil, []string{"pair", "add", "-5", "--config", missing}, exitUsage},
		{nil, []string{"pair", "revoke", "bob", "--config", missing}, exitUsage},
		{nil, []string{"triage", "once", "--config", bad}, exitConfig},
		{nil, []string{"mcp", "test", "--config", bad}, exitConfig},
	}
	for _, c := range cases {
		_, errOut, code := gpuhostEnv(t, c.env, c.args...)
		if code != c.want {
			t.Errorf("%v gpuhost %s: exit %d, want %d; stderr %q", c.env, strings.Join(c.args, " "), code, c.want, errOut)
		}
	}

	// The doctor ran and found a failure (no NVIDIA driver for gpu.backend
	// nvml, checked locally since nothing listens at the config's listen): 1.
	cfg := strings.Replace(string(config.Example), "listen: 127.0.0.1:8080", fmt.Sprintf("listen: 127.0.0.1:%d", testkit.FreePort(t)), 1)
	cfg = strings.Replace(cfg, "state_dir: /var/lib/gpuhost", "state_dir: "+filepath.Join(dir, "state"), 1)
	local := filepath.Join(dir, "local.yaml")
	if err := os.WriteFile(local, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := gpuhostEnv(t, []string{"HOME=" + dir}, "doctor", "--config", local)
	if code != exitProblem || !strings.Contains(out, "FAIL") {
		t.Errorf("doctor with a failing check: exit %d, want %d\n%s%s", code, exitProblem, out, errOut)
	}

	out, code = gpuhost(t, "help", "exit-codes")
	for _, w := range []string{"0 ", "1 ", "64 ", "69 ", "78 "} {
		if code != 0 || !strings.Contains(out, "\n  "+w) {
			t.Errorf("help exit-codes: exit %d, no line for %q:\n%s", code, w, out)
		}
	}
}
