package main

import (
	"context"
	"fmt"
	"gpuhost/internal/testkit"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/bench/ollamatest"
	"gpuhost/bench/tinygguf"
	"gpuhost/config"
	"gpuhost/frontdoor/proxy"
	"gpuhost/units"
)

// ollamaProxy is gpuhost's /v1 proxy in this process with one active
// profile, a real Ollama serving a tiny model whose template takes tools
// (the agents always send tools; Ollama refuses them for a template
// without .Tools) and whose answers are capped at 24 tokens (the model
// never stops on its own; Claude Code asks for 32000 unless
// CLAUDE_CODE_MAX_OUTPUT_TOKENS caps it, and Ollama takes the request's
// cap over num_predict). It returns the
// proxy's URL and its access log.
func ollamaProxy(t *testing.T) (string, *testkit.SyncBuffer) {
	t.Helper()
	base, _ := ollamatest.Start(t)
	dir := t.TempDir()
	gguf, err := tinygguf.WriteFile(dir, ollamatest.ModelConfig)
	if err != nil {
		t.Fatal(err)
	}
	mf := filepath.Join(dir, "Modelfile")
	text := fmt.Sprintf("FROM %s\nTEMPLATE \"\"\"{{ if .Tools }}{{ end }}{{ .Prompt }}\"\"\"\nPARAMETER num_thread 1\nPARAMETER num_ctx 4096\nPARAMETER num_predict 24\n", gguf)
	if err := os.WriteFile(mf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	ollamatest.Create(t, ollamatest.Binary(t), base, "tools", mf)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(base, "http://"))
	n, _ := strconv.Atoi(port)
	prof := &units.Profile{Name: "tiny", Backend: units.Ollama, Model: "tools", Port: n}
	var logs testkit.SyncBuffer
	p := proxy.New(activeOnly{prof}, config.ProxyConfig{}, func() map[string]*units.Profile {
		return map[string]*units.Profile{prof.Name: prof}
	}, slog.New(slog.NewTextHandler(&logs, nil)))
	e := echo.New()
	p.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); p.Close() })
	return srv.URL, &logs
}

// activeOnly is a Supervisor whose one profile is active.
type activeOnly struct{ prof *units.Profile }

func (a activeOnly) State() api.State {
	return api.State{Phase: api.PhaseActive, Profile: a.prof.Name, Backend: a.prof.Backend}
}
func (a activeOnly) AwaitActive(context.Context) (*units.Profile, error) { return a.prof, nil }
func (a activeOnly) Switch(context.Context, string, api.SwitchOptions) (string, <-chan error, error) {
	return "", nil, fmt.Errorf("no switches here")
}

// TestAgentClientsRealOllama: one plain turn of the real Claude Code (over
// /v1/messages) and of the real Codex CLI (over /v1/responses) against a
// real Ollama 0.17.4 through gpuhost's proxy: each turn is answered (Codex
// completes; Claude Code reports the capped answer), and the proxy's access
// log has the requests with their tokens and complete streams.
func TestAgentClientsRealOllama(t *testing.T) {
	claude := agentBinary(t, "GPUHOST_CLAUDE_CODE", "claude-code", "claude", "@anthropic-ai/claude-code", claudeCodeVersion)
	codex := agentBinary(t, "GPUHOST_CODEX", "codex", "codex", "@openai/codex", codexVersion)
	url, logs := ollamaProxy(t)
	home, work := t.TempDir(), t.TempDir()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8", "ANTHROPIC_BASE_URL=" + url, "ANTHROPIC_AUTH_TOKEN=x",
		"ANTHROPIC_MODEL=tools", "ANTHROPIC_SMALL_FAST_MODEL=tools", "CLAUDE_CODE_MAX_OUTPUT_TOKENS=24", "DISABLE_TELEMETRY=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}
	out, errOut, err := runAgent(t, work, env, claude, "-p", "Say hi.")
	t.Logf("claude -p 'Say hi.' against the real Ollama: %v\n%s\nstderr:\n%s", err, out, errOut)
	// The tiny model never ends a turn itself, so each answer stops at the
	// cap (stop_reason max_tokens), which Claude Code reports as its one
	// error; anything else is a failure.
	if err != nil && !strings.Contains(out, "exceeded the 24 output token maximum") {
		t.Errorf("claude: %v", err)
	}
	codexHome := filepath.Join(home, ".codex")
	if err := os.MkdirAll(codexHome, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := "model = \"tools\"\nmodel_provider = \"gpuhost\"\n\n[model_providers.gpuhost]\nname = \"gpuhost\"\nbase_url = \"" + url + "/v1\"\nwire_api = \"responses\"\n"
	if err := os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = runAgent(t, work, env[:3], codex, "exec", "--skip-git-repo-check", "Say hi.")
	t.Logf("codex exec 'Say hi.' against the real Ollama: %v\n%s\nstderr:\n%s", err, out, errOut)
	if err != nil {
		t.Errorf("codex: %v", err)
	}
	log := logs.String()
	for _, path := range []string{"/v1/messages", "/v1/responses"} {
		var lines []string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "path="+path+" ") {
				lines = append(lines, l)
			}
		}
		t.Logf("gpuhost's access log for %s:\n%s", path, strings.Join(lines, "\n"))
		if !tokensLogged(lines) {
			t.Errorf("no %s request with tokens in gpuhost's log", path)
		}
	}
}
