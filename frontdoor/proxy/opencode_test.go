package proxy_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"gpuhost/api"
	"gpuhost/frontdoor/proxy"
	"gpuhost/units"
)

func opencodeModels() []proxy.OpencodeModelInfo {
	return []proxy.OpencodeModelInfo{
		{ID: "qwen3-coder", Profile: "coder", Backend: units.VLLM, Context: 32768, AutoToolChoice: true, ToolCallParser: "qwen3_xml"},
		// Same served name: listed once, as the first.
		{ID: "qwen3-coder", Profile: "coder-greedy", Backend: units.VLLM},
		{ID: "llama3.1:8b", Profile: "llama", Backend: units.Ollama, Context: 8192},
		{ID: "qwen2.5:32b", Profile: "qwen", Backend: units.Ollama, Context: 32768},
		{ID: "plain", Profile: "plain", Backend: units.VLLM, Context: 65536},
		{ID: "parserless", Profile: "parserless", Backend: units.VLLM, Context: 65536, AutoToolChoice: true},
		{ID: "huge", Profile: "huge", Backend: units.VLLM, Context: 262144, AutoToolChoice: true, ToolCallParser: "hermes"},
		{ID: "unknown-ctx", Profile: "unknown-ctx", Backend: units.VLLM, AutoToolChoice: true, ToolCallParser: "hermes"},
	}
}

func TestOpencodeConfigGolden(t *testing.T) {
	got, skipped, err := proxy.OpencodeConfig("http://box.lan:8080", opencodeModels(), "GPUHOST_API_TOKEN", 0)
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "$schema": "https://opencode.ai/config.json",
  "provider": {
    "gpuhost": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "gpuhost",
      "options": {
        "baseURL": "http://box.lan:8080/v1",
        "apiKey": "{env:GPUHOST_API_TOKEN}",
        "includeUsage": true
      },
      "models": {
        "huge": {
          "name": "huge (vllm, gpuhost profile huge)",
          "limit": {
            "context": 262144,
            "output": 32000
          },
          "tool_call": true
        },
        "qwen2.5:32b": {
          "name": "qwen2.5:32b (ollama, gpuhost profile qwen)",
          "limit": {
            "context": 32768,
            "output": 8192
          },
          "tool_call": true
        },
        "qwen3-coder": {
          "name": "qwen3-coder (vllm, gpuhost profile coder)",
          "limit": {
            "context": 32768,
            "output": 8192
          },
          "tool_call": true
        },
        "unknown-ctx": {
          "name": "unknown-ctx (vllm, gpuhost profile unknown-ctx)",
          "tool_call": true
        }
      }
    }
  }
}
`
	if string(got) != want {
		t.Fatalf("OpencodeConfig =\n%s\nwant\n%s", got, want)
	}
	// The unusable ones come back with the reason and the profile fix.
	wantSkipped := map[string][]string{
		"llama3.1:8b": {"context 8192 tokens is below 16384", "raise ollama.num_ctx to at least 16384 in profile llama"},
		"plain":       {"no tool calling", "vllm.enable_auto_tool_choice: true and vllm.tool_call_parser", "in profile plain"},
		"parserless":  {"no tool calling", "in profile parserless"},
	}
	if len(skipped) != len(wantSkipped) {
		t.Fatalf("skipped %v, want %d", skipped, len(wantSkipped))
	}
	for _, s := range skipped {
		for _, w := range wantSkipped[s.Model] {
			if !strings.Contains(s.String(), w) {
				t.Errorf("skipped %q lacks %q", s, w)
			}
		}
	}
}

func TestOpencodeConfigMinContext(t *testing.T) {
	tests := []struct {
		name     string
		min      int
		wantIn   []string
		wantSkip string
	}{
		{"default floor", 0, []string{"qwen3-coder", "huge"}, "llama3.1:8b"},
		{"lower floor lets 8k in", 8192, []string{"llama3.1:8b"}, "plain"},
		{"higher floor", 40000, []string{"huge"}, "qwen3-coder"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, skipped, err := proxy.OpencodeConfig("http://box", opencodeModels(), "", tc.min)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range tc.wantIn {
				if !strings.Contains(string(got), `"`+id+`": {`) {
					t.Errorf("%s not listed:\n%s", id, got)
				}
			}
			if strings.Contains(string(got), `"`+tc.wantSkip+`": {`) {
				t.Errorf("%s listed:\n%s", tc.wantSkip, got)
			}
			found := false
			for _, s := range skipped {
				found = found || s.Model == tc.wantSkip
			}
			if !found {
				t.Errorf("%s not reported as skipped: %v", tc.wantSkip, skipped)
			}
		})
	}
	// Nothing usable: an error naming why, never an empty provider.
	_, _, err := proxy.OpencodeConfig("http://box", opencodeModels()[2:3], "", 0)
	if err == nil || !strings.Contains(err.Error(), "no model opencode can use") || !strings.Contains(err.Error(), "ollama.num_ctx") {
		t.Fatalf("only an 8k model: err %v", err)
	}
}

func TestOpencodeModelsJoin(t *testing.T) {
	list := proxy.ModelList{Data: []proxy.ModelCard{
		{ID: "qwen3-coder", Profile: "coder", Backend: units.VLLM, MaxModelLen: 40960, Aliases: []string{"coder"}},
		{ID: "coder", Profile: "coder", Backend: units.VLLM, MaxModelLen: 40960, AliasOf: "qwen3-coder"},
		{ID: "llama3.1:8b", Profile: "llama", Backend: units.Ollama},
	}}
	profiles := []api.ProfileInfo{
		{Name: "coder", Backend: units.VLLM, Context: 65536, AutoToolChoice: true, ToolCallParser: "qwen3_xml"},
		{Name: "llama", Backend: units.Ollama},
	}
	got := proxy.OpencodeModels(list, profiles)
	want := []proxy.OpencodeModelInfo{
		// The live context from /v1/models wins over the profile's.
		{ID: "qwen3-coder", Profile: "coder", Backend: units.VLLM, Context: 40960, AutoToolChoice: true, ToolCallParser: "qwen3_xml"},
		// Ollama without num_ctx: its default.
		{ID: "llama3.1:8b", Profile: "llama", Backend: units.Ollama, Context: units.OllamaDefaultNumCtx},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("OpencodeModels =\n%+v\nwant\n%+v", got, want)
	}
}

func TestMergeOpencodeConfig(t *testing.T) {
	existing := `{
  "$schema": "https://opencode.ai/config.json",
  "theme": "tokyonight",
  "model": "anthropic/claude-sonnet-4",
  "mcp": {"gpuhost": {"type": "local", "command": ["gpuhost", "mcp"]}},
  "provider": {
    "anthropic": {"options": {"apiKey": "{env:ANTHROPIC_API_KEY}"}},
    "gpuhost": {"npm": "old", "models": {"stale": {"name": "stale"}}}
  }
}`
	tests := []struct {
		name, existing string
		wantErr        string
		check          func(t *testing.T, doc map[string]any)
	}{
		{name: "keeps other keys and providers, replaces gpuhost", existing: existing, check: func(t *testing.T, doc map[string]any) {
			if doc["theme"] != "tokyonight" || doc["model"] != "anthropic/claude-sonnet-4" || doc["mcp"] == nil {
				t.Errorf("other keys lost: %v", doc)
			}
			prov := doc["provider"].(map[string]any)
			if a, _ := prov["anthropic"].(map[string]any); a == nil || a["options"].(map[string]any)["apiKey"] != "{env:ANTHROPIC_API_KEY}" {
				t.Errorf("anthropic provider lost: %v", prov)
			}
			g := prov["gpuhost"].(map[string]any)
			models := g["models"].(map[string]any)
			if g["npm"] != "@ai-sdk/openai-compatible" || models["stale"] != nil || models["qwen3-coder"] == nil {
				t.Errorf("gpuhost provider not replaced: %v", g)
			}
		}},
		{name: "empty file", existing: " \n", check: func(t *testing.T, doc map[string]any) {
			if doc["$schema"] != "https://opencode.ai/config.json" || doc["provider"].(map[string]any)["gpuhost"] == nil {
				t.Errorf("new file: %v", doc)
			}
		}},
		{name: "no provider key yet", existing: `{"theme": "x"}`, check: func(t *testing.T, doc map[string]any) {
			if doc["theme"] != "x" || doc["provider"].(map[string]any)["gpuhost"] == nil {
				t.Errorf("merged: %v", doc)
			}
		}},
		{name: "comments are refused", existing: "{\n  // mine\n  \"theme\": \"x\"\n}", wantErr: "not a plain JSON object"},
		{name: "array", existing: `[1]`, wantErr: "not a plain JSON object"},
		{name: "null", existing: `null`, wantErr: "not a plain JSON object"},
		{name: "provider not an object", existing: `{"provider": 3}`, wantErr: "provider is not a JSON object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := proxy.MergeOpencodeConfig([]byte(tc.existing), "http://box:8080", opencodeModels(), "", 0)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var doc map[string]any
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("merged file is not JSON: %v\n%s", err, out)
			}
			tc.check(t, doc)
		})
	}
}

func TestOpencodeConfig(t *testing.T) {
	tests := []struct {
		name, base, env string
		wantBase        string
		wantErr         string
	}{
		{name: "root", base: "http://127.0.0.1:8080", wantBase: "http://127.0.0.1:8080/v1"},
		{name: "trailing slash", base: "http://box:8080/", wantBase: "http://box:8080/v1"},
		{name: "already /v1", base: "https://box/v1/", wantBase: "https://box/v1"},
		{name: "behind a path", base: "https://gw.example/gpu", wantBase: "https://gw.example/gpu/v1"},
		{name: "ipv6", base: "http://[::1]:8080", wantBase: "http://[::1]:8080/v1"},
		{name: "no key without env", base: "http://box:1", env: "", wantBase: "http://box:1/v1"},
		{name: "no scheme", base: "box:8080", wantErr: "must start with http"},
		{name: "ftp", base: "ftp://box", wantErr: "must start with http"},
		{name: "no host", base: "http://", wantErr: "has no host"},
		{name: "user info", base: "http://u:p@box", wantErr: "without user"},
		{name: "query", base: "http://box?x=1", wantErr: "without user, query"},
		{name: "bad env name", base: "http://box", env: "MY-TOKEN", wantErr: "not an environment variable name"},
		{name: "env with braces", base: "http://box", env: "X}", wantErr: "not an environment variable name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := proxy.OpencodeConfig(tc.base, opencodeModels(), tc.env, 0)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var cfg struct {
				Provider map[string]struct {
					Options map[string]any `json:"options"`
				} `json:"provider"`
			}
			if err := json.Unmarshal(got, &cfg); err != nil {
				t.Fatal(err)
			}
			opts := cfg.Provider["gpuhost"].Options
			if opts["baseURL"] != tc.wantBase {
				t.Fatalf("baseURL %v, want %s", opts["baseURL"], tc.wantBase)
			}
			if _, has := opts["apiKey"]; has != (tc.env != "") {
				t.Fatalf("apiKey present = %v with env %q", has, tc.env)
			}
		})
	}
	if _, _, err := proxy.OpencodeConfig("http://box", nil, "", 0); err == nil {
		t.Fatal("no models: want an error")
	}
}

// FuzzOpencodeConfig: any base URL and variable name either fails with an
// error or gives valid JSON whose baseURL ends in /v1 and whose apiKey is
// only ever the {env:…} reference.
func FuzzOpencodeConfig(f *testing.F) {
	f.Add("http://box:8080", "GPUHOST_API_TOKEN")
	f.Add("https://[::1]:1/x/v1/", "")
	f.Add("http://h/%zz", "A}")
	f.Fuzz(func(t *testing.T, base, env string) {
		out, _, err := proxy.OpencodeConfig(base, opencodeModels(), env, 0)
		if err != nil {
			return
		}
		var cfg struct {
			Provider map[string]struct {
				Options struct {
					BaseURL string  `json:"baseURL"`
					APIKey  *string `json:"apiKey"`
				} `json:"options"`
			} `json:"provider"`
		}
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatalf("invalid JSON for %q: %v", base, err)
		}
		o := cfg.Provider["gpuhost"].Options
		if !strings.HasSuffix(o.BaseURL, "/v1") {
			t.Fatalf("baseURL %q from %q", o.BaseURL, base)
		}
		if (o.APIKey != nil) != (env != "") || o.APIKey != nil && *o.APIKey != "{env:"+env+"}" {
			t.Fatalf("apiKey %v for env %q", o.APIKey, env)
		}
	})
}

// TestClientConfigsCarryNoExpandableText: names a daemon reports with text
// that opencode expands ({file:…}, {env:…}), a '$' or a control character
// are left out of every client's config, each named (quoted) on the skip
// list; the safe model is kept.
func TestClientConfigsCarryNoExpandableText(t *testing.T) {
	hostile := []proxy.OpencodeModelInfo{
		{ID: "{file:/etc/passwd}", Profile: "a", Backend: units.Ollama, Context: 32768},
		{ID: "ok", Profile: "{env:HOME}", Backend: units.Ollama, Context: 32768},
		{ID: "ok2", Profile: "b", Backend: "{file:/x}", Context: 32768},
		{ID: "$HOME", Profile: "c", Backend: units.Ollama, Context: 32768},
		{ID: "bell\a", Profile: "d", Backend: units.Ollama, Context: 32768},
		{ID: "safe", Profile: "safe", Backend: units.Ollama, Context: 32768},
	}
	check := func(name string, out []byte, skipped []proxy.OpencodeSkipped) {
		t.Helper()
		for _, bad := range []string{"{file:", "{env:HOME", "$HOME", "\a", `\u0007`} {
			if strings.Contains(string(out), bad) {
				t.Errorf("%s config carries %q:\n%s", name, bad, out)
			}
		}
		if len(skipped) != 5 {
			t.Errorf("%s: %d skipped, want 5: %v", name, len(skipped), skipped)
		}
		for _, s := range skipped {
			if strings.ContainsFunc(s.String(), func(r rune) bool { return r < 0x20 }) || !strings.Contains(s.Reason, "expand") {
				t.Errorf("%s: skip note %q", name, s)
			}
		}
	}
	out, skipped, err := proxy.OpencodeConfig("http://box:8080", hostile, "", 0)
	if err != nil || !strings.Contains(string(out), `"safe"`) {
		t.Fatalf("opencode: %v\n%s", err, out)
	}
	check("opencode", out, skipped)
	env, skipped, err := proxy.ClaudeCodeEnv("http://box:8080", hostile, true)
	if err != nil || env["ANTHROPIC_MODEL"] != "safe" {
		t.Fatalf("claude-code: %v %v", err, env)
	}
	b, _ := json.Marshal(env)
	check("claude-code", b, skipped)
	prov, model, skipped, err := proxy.CodexProvider("http://box:8080", hostile, "")
	if err != nil || model != "safe" {
		t.Fatalf("codex: %v %v", err, model)
	}
	b, _ = json.Marshal(prov)
	check("codex", b, skipped)
}
