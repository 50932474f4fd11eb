package proxy

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"gpuhost/units"
)

var clientModels = []OpencodeModelInfo{
	{ID: "qwen3-coder", Profile: "coder", Backend: units.VLLM, Context: 65536, AutoToolChoice: true, ToolCallParser: "qwen3_xml"},
	{ID: "plain", Profile: "plain", Backend: units.VLLM, Context: 8192},
	{ID: "llama3.1:8b", Profile: "llama", Backend: units.Ollama},
}

// TestClaudeCodeSettings: the env block points Claude Code at the box
// (no /v1), selects a model with tool calls (plain, without, is left out
// with its fix), keeps the user's keys and own token, and says what
// changed; a file that is not a JSON object is refused.
func TestClaudeCodeSettings(t *testing.T) {
	env, skipped, err := ClaudeCodeEnv("http://box:8080/v1/", clientModels, false)
	if err != nil {
		t.Fatal(err)
	}
	// The output limit leaves the prompt room in the 64k context (Claude
	// Code's default of 32,000 would not fit a 32k one).
	if env["ANTHROPIC_BASE_URL"] != "http://box:8080" || env["ANTHROPIC_MODEL"] != "qwen3-coder" || env["ANTHROPIC_SMALL_FAST_MODEL"] != "qwen3-coder" ||
		env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] != "16384" {
		t.Errorf("env %v", env)
	}
	if _, has := env["ANTHROPIC_AUTH_TOKEN"]; has {
		t.Error("beyond loopback a token is written")
	}
	if len(skipped) != 1 || skipped[0].Model != "plain" || !strings.Contains(skipped[0].Fix, "tool_call_parser") {
		t.Errorf("skipped %v", skipped)
	}
	existing := []byte(`{"permissions":{"allow":["Bash(ls)"]},"env":{"FOO":"1","ANTHROPIC_AUTH_TOKEN":"mine","ANTHROPIC_MODEL":"old"}}`)
	loop, _, _ := ClaudeCodeEnv("http://127.0.0.1:8080", clientModels, true)
	out, changed, err := MergeClaudeCodeSettings(existing, loop)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Permissions map[string]any
		Env         map[string]string
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Permissions == nil || doc.Env["FOO"] != "1" || doc.Env["ANTHROPIC_AUTH_TOKEN"] != "mine" || doc.Env["ANTHROPIC_MODEL"] != "qwen3-coder" {
		t.Errorf("merged %s", out)
	}
	if slices.Contains(changed, "ANTHROPIC_AUTH_TOKEN") || !slices.Contains(changed, "ANTHROPIC_MODEL") {
		t.Errorf("changed %v", changed)
	}
	if again, changed, _ := MergeClaudeCodeSettings(out, loop); string(again) != string(out) || len(changed) != 0 {
		t.Errorf("a second merge changed %v", changed)
	}
	for _, bad := range []string{"[1]", "{\"env\": 3}", "// c\n{}", "null"} {
		if _, _, err := MergeClaudeCodeSettings([]byte(bad), loop); err == nil {
			t.Errorf("%q merged", bad)
		}
	}
	if _, _, err := ClaudeCodeEnv("http://box", clientModels[1:2], false); err == nil || !strings.Contains(err.Error(), "no model with tool calls") {
		t.Errorf("no usable model: %v", err)
	}
}

// TestCodexConfig: the provider speaks Responses at /v1, is selected, and
// the user's other providers and keys stay; invalid TOML is refused.
func TestCodexConfig(t *testing.T) {
	prov, model, _, err := CodexProvider("http://box:8080", clientModels, "GPUHOST_API_TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	existing := []byte("approval_policy = \"on-request\"\nmodel = \"gpt-5\"\n\n[model_providers.other]\nname = \"Other\"\nbase_url = \"https://x/v1\"\n")
	out, err := MergeCodexConfig(existing, prov, model)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Model          string `toml:"model"`
		ModelProvider  string `toml:"model_provider"`
		ApprovalPolicy string `toml:"approval_policy"`
		ModelProviders map[string]struct {
			Name    string `toml:"name"`
			BaseURL string `toml:"base_url"`
			WireAPI string `toml:"wire_api"`
			EnvKey  string `toml:"env_key"`
		} `toml:"model_providers"`
	}
	if err := toml.Unmarshal(out, &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	g := doc.ModelProviders["gpuhost"]
	if doc.Model != "qwen3-coder" || doc.ModelProvider != "gpuhost" || doc.ApprovalPolicy != "on-request" || doc.ModelProviders["other"].Name != "Other" ||
		g.BaseURL != "http://box:8080/v1" || g.WireAPI != "responses" || g.EnvKey != "GPUHOST_API_TOKEN" {
		t.Errorf("merged:\n%s", out)
	}
	for _, bad := range []string{"model = ", "model_providers = 3"} {
		if _, err := MergeCodexConfig([]byte(bad), prov, model); err == nil {
			t.Errorf("%q merged", bad)
		}
	}
	if _, _, _, err := CodexProvider("http://box", clientModels, "no-such var"); err == nil {
		t.Error("a bad variable name was taken")
	}
}
