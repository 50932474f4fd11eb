package proxy

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"gpuhost/units"
)

// opencode reads provider blocks from opencode.json: a custom provider names
// the AI SDK package that talks to it (@ai-sdk/openai-compatible for any
// OpenAI-compatible server), its options (baseURL, apiKey, includeUsage) and
// its models, whose fields are models.dev's (name, limit.context,
// limit.output, tool_call). opencode substitutes {env:NAME} in string values
// when it loads the file, so a token is referenced, never written.

// OpencodeProviderID is the provider key in the generated config; models are
// then selected as "gpuhost/<served name>".
const OpencodeProviderID = "gpuhost"

// opencodeOutputCap is opencode's own ceiling on max output tokens.
const opencodeOutputCap = 32000

type opencodeFile struct {
	Schema   string                      `json:"$schema"`
	Provider map[string]opencodeProvider `json:"provider"`
}

type opencodeProvider struct {
	NPM     string                   `json:"npm"`
	Name    string                   `json:"name"`
	Options opencodeOptions          `json:"options"`
	Models  map[string]opencodeModel `json:"models"`
}

type opencodeOptions struct {
	BaseURL string `json:"baseURL"`
	APIKey  string `json:"apiKey,omitempty"`
	// IncludeUsage makes the AI SDK send stream_options.include_usage, so
	// opencode counts tokens (and gpuhost's access log has them).
	IncludeUsage bool `json:"includeUsage"`
}

type opencodeModel struct {
	Name     string         `json:"name"`
	Limit    *opencodeLimit `json:"limit,omitempty"`
	ToolCall bool           `json:"tool_call"`
}

type opencodeLimit struct {
	Context int `json:"context"`
	Output  int `json:"output"`
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// OpencodeConfig renders a ready opencode.json with one provider, "gpuhost",
// whose models are the profiles' served names. baseURL is the daemon's
// address as clients reach it (http://box:8080, with or without /v1).
// apiKeyEnv, when not empty, names the environment variable that holds the
// bearer token; the file then says {env:NAME} and never holds the token.
//
// Per model: limit.context is the profile's max_model_len (vLLM) or num_ctx
// (Ollama); limit.output is a quarter of it (at most opencode's 32000), so
// that prompt + max_tokens stays inside the context, which vLLM enforces
// with a 400; a profile without a configured context gets no limit (the
// backend's default is not known here). tool_call is true for Ollama and for
// vLLM with enable_auto_tool_choice (vLLM refuses tools without it).
// Profiles sharing a served name give one model (the first by profile name).
func OpencodeConfig(baseURL string, profiles map[string]*units.Profile, apiKeyEnv string) ([]byte, error) {
	base, err := opencodeBaseURL(baseURL)
	if err != nil {
		return nil, err
	}
	if apiKeyEnv != "" && !envNameRE.MatchString(apiKeyEnv) {
		return nil, fmt.Errorf("opencode config: api key variable %q is not an environment variable name", apiKeyEnv)
	}
	if len(profiles) == 0 {
		return nil, fmt.Errorf("opencode config: no profiles to list as models")
	}
	prov := opencodeProvider{NPM: "@ai-sdk/openai-compatible", Name: "gpuhost",
		Options: opencodeOptions{BaseURL: base, IncludeUsage: true}, Models: map[string]opencodeModel{}}
	if apiKeyEnv != "" {
		prov.Options.APIKey = "{env:" + apiKeyEnv + "}"
	}
	for _, name := range sortedNames(profiles) {
		prof := profiles[name]
		served := prof.ServedModelName()
		if _, dup := prov.Models[served]; dup {
			continue
		}
		m := opencodeModel{Name: fmt.Sprintf("%s (%s, gpuhost profile %s)", served, prof.Backend, prof.Name),
			ToolCall: prof.Backend == units.Ollama || prof.VLLM.EnableAutoToolChoice}
		if n := profileContext(prof); n > 0 {
			m.Limit = &opencodeLimit{Context: n, Output: min(max(n/4, 1), opencodeOutputCap)}
		}
		prov.Models[served] = m
	}
	out, err := json.MarshalIndent(opencodeFile{Schema: "https://opencode.ai/config.json",
		Provider: map[string]opencodeProvider{OpencodeProviderID: prov}}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("opencode config: encode: %w", err)
	}
	return append(out, '\n'), nil
}

// opencodeBaseURL checks the daemon URL and points it at /v1.
func opencodeBaseURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("opencode config: base URL %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("opencode config: base URL %q must start with http:// or https://", raw)
	}
	if u.Host == "" {
		return "", fmt.Errorf("opencode config: base URL %q has no host", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("opencode config: base URL %q must be scheme://host:port[/path] without user, query or fragment", raw)
	}
	path := strings.TrimRight(u.Path, "/")
	if !strings.HasSuffix(path, "/v1") {
		path += "/v1"
	}
	u.Path, u.RawPath = path, ""
	return u.String(), nil
}
