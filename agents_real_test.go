package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The real coding agents that speak the other /v1 APIs, installed by
// .ci/run from npm and cached under <user cache dir>/gpuhost/<name>.
const (
	claudeCodeVersion = "2.1.328"
	codexVersion      = "0.169.0"
	// requireAgentClientsEnv makes a missing client a failure (.ci/run).
	requireAgentClientsEnv = "GPUHOST_REQUIRE_AGENT_CLIENTS"
)

// agentBinary is the client's binary: $envVar, else the one .ci/run
// installs. Without one the test skips loudly, unless
// GPUHOST_REQUIRE_AGENT_CLIENTS=1.
func agentBinary(t *testing.T, envVar, dir, bin, pkg, version string) string {
	t.Helper()
	path := os.Getenv(envVar)
	if path == "" {
		if cache, err := os.UserCacheDir(); err == nil {
			path = filepath.Join(cache, "gpuhost", dir, "node_modules", ".bin", bin)
		}
	}
	if _, err := os.Stat(path); path == "" || err != nil {
		msg := fmt.Sprintf("%s TEST NOT RUN: no %s binary at %q ($%s or <user cache dir>/gpuhost/%s; %v); install it as .ci/run does: npm install --prefix ~/.cache/gpuhost/%s %s@%s",
			strings.ToUpper(dir), bin, path, envVar, dir, err, dir, pkg, version)
		if os.Getenv(requireAgentClientsEnv) == "1" {
			t.Fatal(msg + " — " + requireAgentClientsEnv + "=1 makes this a failure")
		}
		t.Skip(msg)
	}
	return path
}

// agentPrompt asks for the bash tool with a quoted command, which the
// demo's scripted model calls as asked; its output (42xyz) is not in the
// prompt: only a command that ran can produce it.
const agentPrompt = `run the bash command "echo $((6*7))xyz"`

// v1Lines are the proxy's access-log lines for path with their tokens.
func v1Lines(console, path string) []string {
	re := regexp.MustCompile(`msg="v1 request" component=proxy method=POST path=` + regexp.QuoteMeta(path) + ` .*`)
	return re.FindAllString(console, -1)
}

// tokensLogged reports whether some line has non-zero prompt and
// completion tokens.
func tokensLogged(lines []string) bool {
	re := regexp.MustCompile(`prompt_tokens=([1-9]\d*) completion_tokens=([1-9]\d*)`)
	for _, l := range lines {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

// runAgent runs a client with its whole environment given.
func runAgent(t *testing.T, dir string, env []string, name string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdin = strings.NewReader("")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestClaudeCodeRealClient: the real Claude Code, configured only by
// `gpuhost client-config claude-code --write` in an isolated home, runs one
// prompt against the demo over /v1/messages: the scripted model calls its
// Bash tool, Claude Code runs it and sends the tool_result back, and the
// answer quotes it; gpuhost's access log has the Messages requests with
// their tokens.
func TestClaudeCodeRealClient(t *testing.T) {
	bin := agentBinary(t, "GPUHOST_CLAUDE_CODE", "claude-code", "claude", "@anthropic-ai/claude-code", claudeCodeVersion)
	url, state, console := startDemo(t)
	home, work := t.TempDir(), t.TempDir()
	out, errOut, code := gpuhostEnv(t, []string{envDaemonURL + "=" + url, "HOME=" + home, "CLAUDE_CONFIG_DIR="}, "client-config", "claude-code", "--write")
	if code != 0 {
		t.Fatalf("client-config claude-code --write: exit %d\n%s%s", code, out, errOut)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8", "SHELL=/bin/bash"}
	stdout, stderr, err := runAgent(t, work, env, bin, "-p", agentPrompt, "--allowedTools", "Bash", "--output-format", "text")
	t.Logf("claude -p %q --allowedTools Bash: %v\n%s\nstderr:\n%s", agentPrompt, err, stdout, stderr)
	if err != nil {
		t.Fatalf("claude: %v\ndemo:\n%s", err, console())
	}
	if !strings.Contains(stdout, "42xyz") {
		t.Errorf("the answer %q does not quote the tool's result", stdout)
	}
	unitLog, _ := os.ReadFile(filepath.Join(state, "logs", "gpuhost-vllm.log"))
	if !hasLogLine(string(unitLog), `msg="scripted turn on tool results"`, "tools=Bash", "answered=true") {
		t.Errorf("the backend's log has no answer on Bash's result:\n%s", unitLog)
	}
	lines := v1Lines(console(), "/v1/messages")
	t.Logf("gpuhost's access log for /v1/messages:\n%s", strings.Join(lines, "\n"))
	if len(lines) < 2 || !tokensLogged(lines) {
		t.Errorf("the proxy logged %d Messages requests, tokens %v", len(lines), tokensLogged(lines))
	}
}

// TestCodexRealClient: the real Codex CLI, configured only by `gpuhost
// client-config codex --write`, runs one prompt against the demo over
// /v1/responses: its shell tool is called, runs, and the answer quotes the
// result; gpuhost's access log has the Responses requests with tokens.
func TestCodexRealClient(t *testing.T) {
	bin := agentBinary(t, "GPUHOST_CODEX", "codex", "codex", "@openai/codex", codexVersion)
	url, _, console := startDemo(t)
	home, work := t.TempDir(), t.TempDir()
	out, errOut, code := gpuhostEnv(t, []string{envDaemonURL + "=" + url, "HOME=" + home, "CODEX_HOME="}, "client-config", "codex", "--write")
	if code != 0 {
		t.Fatalf("client-config codex --write: exit %d\n%s%s", code, out, errOut)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8", "SHELL=/bin/bash"}
	stdout, stderr, err := runAgent(t, work, env, bin, "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access", agentPrompt)
	t.Logf("codex exec %q: %v\n%s\nstderr:\n%s", agentPrompt, err, stdout, stderr)
	if err != nil {
		t.Fatalf("codex: %v\ndemo:\n%s", err, console())
	}
	if !strings.Contains(stdout, "[simulated model] Based on ") || !strings.Contains(stdout, "42xyz") {
		t.Errorf("the answer %q does not quote the tool's result", stdout)
	}
	lines := v1Lines(console(), "/v1/responses")
	t.Logf("gpuhost's access log for /v1/responses:\n%s", strings.Join(lines, "\n"))
	if len(lines) < 2 || !tokensLogged(lines) {
		t.Errorf("the proxy logged %d Responses requests, tokens %v", len(lines), tokensLogged(lines))
	}
}
