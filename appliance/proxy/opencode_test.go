package proxy_test

import (
	"encoding/json"
	"strings"
	"testing"

	"gpuhost/appliance/proxy"
	"gpuhost/units"
)

func opencodeProfiles() map[string]*units.Profile {
	return map[string]*units.Profile{
		"coder": {Name: "coder", Backend: units.VLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct", ServedName: "qwen3-coder",
			VLLM: units.VLLMFlags{MaxModelLen: 32768, EnableAutoToolChoice: true, ToolCallParser: "qwen3_xml"}},
		// Same served name: listed once, as the first profile by name.
		"coder-greedy": {Name: "coder-greedy", Backend: units.VLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct", ServedName: "qwen3-coder"},
		"llama":        {Name: "llama", Backend: units.Ollama, Model: "llama3.1:8b", ServedName: "llama3.1:8b", Ollama: units.OllamaOpts{NumCtx: 8192}},
		"plain":        {Name: "plain", Backend: units.VLLM, Model: "org/plain", ServedName: "plain"},
		"huge":         {Name: "huge", Backend: units.VLLM, Model: "org/huge", ServedName: "huge", VLLM: units.VLLMFlags{MaxModelLen: 262144}},
	}
}

func TestOpencodeConfigGolden(t *testing.T) {
	got, err := proxy.OpencodeConfig("http://box.lan:8080", opencodeProfiles(), "GPUHOST_API_TOKEN")
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
          "tool_call": false
        },
        "llama3.1:8b": {
          "name": "llama3.1:8b (ollama, gpuhost profile llama)",
          "limit": {
            "context": 8192,
            "output": 2048
          },
          "tool_call": true
        },
        "plain": {
          "name": "plain (vllm, gpuhost profile plain)",
          "tool_call": false
        },
        "qwen3-coder": {
          "name": "qwen3-coder (vllm, gpuhost profile coder)",
          "limit": {
            "context": 32768,
            "output": 8192
          },
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
			got, err := proxy.OpencodeConfig(tc.base, opencodeProfiles(), tc.env)
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
	if _, err := proxy.OpencodeConfig("http://box", nil, ""); err == nil {
		t.Fatal("no profiles: want an error")
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
		out, err := proxy.OpencodeConfig(base, opencodeProfiles(), env)
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
