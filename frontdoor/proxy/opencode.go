package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"gpuhost/api"
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

// outputLimit is the output tokens a client config allows a model with a
// context of ctx tokens: a quarter of it (the rest is the prompt), at most
// opencodeOutputCap.
func outputLimit(ctx int) int { return min(max(ctx/4, 1), opencodeOutputCap) }

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

// OpencodeMinContext is the default floor on a model's context for
// opencode: its system prompt and tool schemas alone take about 8.2k
// tokens, so below 16k it compacts and loops.
const OpencodeMinContext = 16384

// OpencodeModelInfo is what the generator needs to know of one served
// model, as the daemon reports it (/v1/models and /api/profiles).
type OpencodeModelInfo struct {
	ID      string // served name
	Profile string
	Backend units.Backend
	// Context is the context length in tokens; 0: unknown (vLLM then uses
	// the model's own).
	Context int
	// AutoToolChoice and ToolCallParser are vLLM's; Ollama needs neither.
	AutoToolChoice bool
	ToolCallParser string
}

// ToolCalls reports whether a request with tools (opencode always sends
// them) works: Ollama takes them; vLLM refuses "auto" tool choice without
// enable_auto_tool_choice and a tool_call_parser.
func (m OpencodeModelInfo) ToolCalls() bool {
	return m.Backend == units.Ollama || (m.AutoToolChoice && m.ToolCallParser != "")
}

// OpencodeSkipped is a model left out of the config, with why and how to
// fix its profile.
type OpencodeSkipped struct {
	Model, Profile, Reason, Fix string
}

func (s OpencodeSkipped) String() string {
	return fmt.Sprintf("%s (profile %s) left out: %s; fix: %s", s.Model, s.Profile, s.Reason, s.Fix)
}

// OpencodeModels joins the daemon's /v1/models (contexts, live for the
// loaded model) with its /api/profiles (tool-call settings). Aliases are
// left out: they name a model that is already listed.
func OpencodeModels(list ModelList, profiles []api.ProfileInfo) []OpencodeModelInfo {
	byName := map[string]api.ProfileInfo{}
	for _, p := range profiles {
		byName[p.Name] = p
	}
	var out []OpencodeModelInfo
	for _, card := range list.Data {
		if card.AliasOf != "" {
			continue
		}
		m := OpencodeModelInfo{ID: card.ID, Profile: card.Profile, Backend: card.Backend, Context: card.MaxModelLen}
		if p, ok := byName[card.Profile]; ok {
			m.AutoToolChoice, m.ToolCallParser = p.AutoToolChoice, p.ToolCallParser
			if m.Context == 0 {
				m.Context = p.Context
			}
		}
		if m.Context == 0 && m.Backend == units.Ollama {
			m.Context = units.OllamaDefaultNumCtx
		}
		out = append(out, m)
	}
	return out
}

// OpencodeConfig renders a ready opencode.json with one provider, "gpuhost",
// whose models are the given served models. baseURL is the daemon's
// address as clients reach it (http://box:8080, with or without /v1).
// apiKeyEnv, when not empty, names the environment variable that holds the
// bearer token; the file then says {env:NAME} and never holds the token.
//
// Only models opencode can use are listed: those with working tool calls
// (opencode sends tools with every prompt) and a context of at least
// minContext tokens (0: OpencodeMinContext); the others come back as
// skipped, with the fix. Per model: limit.context is the context;
// limit.output is a quarter of it (at most opencode's 32000), so that
// prompt + max_tokens stays inside the context, which vLLM enforces with a
// 400; a model whose context is unknown gets no limit. Models sharing an id
// give one entry (the first).
func OpencodeConfig(baseURL string, models []OpencodeModelInfo, apiKeyEnv string, minContext int) ([]byte, []OpencodeSkipped, error) {
	prov, skipped, err := opencodeProviderBlock(baseURL, models, apiKeyEnv, minContext)
	if err != nil {
		return nil, skipped, err
	}
	out, err := json.MarshalIndent(opencodeFile{Schema: opencodeSchema,
		Provider: map[string]opencodeProvider{OpencodeProviderID: prov}}, "", "  ")
	if err != nil {
		return nil, skipped, fmt.Errorf("opencode config: encode: %w", err)
	}
	return append(out, '\n'), skipped, nil
}

const opencodeSchema = "https://opencode.ai/config.json"

func opencodeProviderBlock(baseURL string, models []OpencodeModelInfo, apiKeyEnv string, minContext int) (opencodeProvider, []OpencodeSkipped, error) {
	var prov opencodeProvider
	base, err := opencodeBaseURL(baseURL)
	if err != nil {
		return prov, nil, err
	}
	if apiKeyEnv != "" && !envNameRE.MatchString(apiKeyEnv) {
		return prov, nil, fmt.Errorf("opencode config: api key variable %q is not an environment variable name", apiKeyEnv)
	}
	if minContext <= 0 {
		minContext = OpencodeMinContext
	}
	if len(models) == 0 {
		return prov, nil, fmt.Errorf("opencode config: the daemon serves no models")
	}
	prov = opencodeProvider{NPM: "@ai-sdk/openai-compatible", Name: "gpuhost",
		Options: opencodeOptions{BaseURL: base, IncludeUsage: true}, Models: map[string]opencodeModel{}}
	if apiKeyEnv != "" {
		prov.Options.APIKey = "{env:" + apiKeyEnv + "}"
	}
	var skipped []OpencodeSkipped
	for _, m := range models {
		if _, dup := prov.Models[m.ID]; dup {
			continue
		}
		if sk, ok := opencodeUnusable(m, minContext); ok {
			skipped = append(skipped, sk)
			continue
		}
		om := opencodeModel{Name: fmt.Sprintf("%s (%s, gpuhost profile %s)", m.ID, m.Backend, m.Profile), ToolCall: true}
		if m.Context > 0 {
			om.Limit = &opencodeLimit{Context: m.Context, Output: outputLimit(m.Context)}
		}
		prov.Models[m.ID] = om
	}
	if len(prov.Models) == 0 {
		reasons := make([]string, 0, len(skipped))
		for _, s := range skipped {
			reasons = append(reasons, s.String())
		}
		return prov, skipped, fmt.Errorf("opencode config: no model opencode can use: %s", strings.Join(reasons, "; "))
	}
	return prov, skipped, nil
}

// opencodeUnusable says why opencode cannot use m, and the profile fix.
func opencodeUnusable(m OpencodeModelInfo, minContext int) (OpencodeSkipped, bool) {
	sk := OpencodeSkipped{Model: m.ID, Profile: m.Profile}
	if err := clientSafe(m); err != nil {
		// The fields come from the daemon's answer; printed with %q so
		// that the note itself carries no control characters.
		sk.Model, sk.Profile = fmt.Sprintf("%q", m.ID), fmt.Sprintf("%q", m.Profile)
		sk.Reason = fmt.Sprintf("the daemon reported a name that a client would expand in its config file: %v", err)
		sk.Fix = "check the daemon asked (--url): gpuhost refuses such names at config load"
		return sk, true
	}
	switch {
	case !m.ToolCalls():
		sk.Reason = "no tool calling (vLLM refuses an agent's tools without enable_auto_tool_choice and tool_call_parser)"
		sk.Fix = fmt.Sprintf("set vllm.enable_auto_tool_choice: true and vllm.tool_call_parser (the model's parser, e.g. hermes, llama3_json, qwen3_xml) in profile %s", m.Profile)
	case m.Context > 0 && m.Context < minContext:
		sk.Reason = fmt.Sprintf("context %d tokens is below %d (opencode's prompt and tool schemas take about 8.2k; it compacts and loops)", m.Context, minContext)
		key := "vllm.max_model_len"
		if m.Backend == units.Ollama {
			key = "ollama.num_ctx"
		}
		sk.Fix = fmt.Sprintf("raise %s to at least %d in profile %s (or lower --min-context)", key, minContext, m.Profile)
	default:
		return sk, false
	}
	return sk, true
}

// clientSafe checks what a client config would carry of a model the daemon
// reported (its id, profile and backend reach opencode's model entry and
// the other clients' settings): nothing opencode expands ({env:…},
// {file:…}), no '$' and no control characters (units.ClientText). The
// daemon may be another one than the user thinks (--url), so its answer
// is not trusted.
func clientSafe(m OpencodeModelInfo) error {
	for _, v := range []string{m.ID, m.Profile, string(m.Backend)} {
		if err := units.ClientText(v); err != nil {
			return err
		}
	}
	if m.ID == "" {
		return errors.New("an empty model id")
	}
	return nil
}

// MergeOpencodeConfig puts the gpuhost provider into an existing
// opencode.json: every other key and provider is kept as it is, the
// "gpuhost" provider is replaced. existing empty (or only white space)
// starts a new file. A file that is not a plain JSON object (opencode
// also reads comments; this does not) is refused, never overwritten.
func MergeOpencodeConfig(existing []byte, baseURL string, models []OpencodeModelInfo, apiKeyEnv string, minContext int) ([]byte, []OpencodeSkipped, error) {
	prov, skipped, err := opencodeProviderBlock(baseURL, models, apiKeyEnv, minContext)
	if err != nil {
		return nil, skipped, err
	}
	doc := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(existing)) > 0 {
		if err := json.Unmarshal(existing, &doc); err != nil || doc == nil {
			if err == nil {
				err = errors.New("null")
			}
			return nil, skipped, fmt.Errorf("opencode config: the existing file is not a plain JSON object (comments or trailing commas are not merged; edit it by hand or move it away): %w", err)
		}
	}
	providers := map[string]json.RawMessage{}
	if raw, ok := doc["provider"]; ok && string(bytes.TrimSpace(raw)) != "null" {
		if err := json.Unmarshal(raw, &providers); err != nil || providers == nil {
			return nil, skipped, fmt.Errorf("opencode config: the existing key provider is not a JSON object: %v", err)
		}
	}
	pb, err := json.Marshal(prov)
	if err != nil {
		return nil, skipped, fmt.Errorf("opencode config: encode: %w", err)
	}
	providers[OpencodeProviderID] = pb
	if doc["provider"], err = json.Marshal(providers); err != nil {
		return nil, skipped, fmt.Errorf("opencode config: encode: %w", err)
	}
	if _, ok := doc["$schema"]; !ok {
		doc["$schema"], _ = json.Marshal(opencodeSchema)
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, skipped, fmt.Errorf("opencode config: encode: %w", err)
	}
	return append(out, '\n'), skipped, nil
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
