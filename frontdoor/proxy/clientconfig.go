package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Config generators for the coding agents that speak the other /v1 APIs:
// Claude Code (Anthropic Messages) reads environment variables, which its
// settings file (~/.claude/settings.json) can hold in an "env" block; the
// Codex CLI (OpenAI Responses) reads ~/.codex/config.toml, whose
// model_providers table names a base URL and wire_api = "responses". Both
// always send tools, so a model without working tool calls is left out,
// as for opencode. Neither file can reference an environment variable, so
// beyond loopback the token is never written: Claude Code is told to read
// ANTHROPIC_AUTH_TOKEN from the shell, Codex's provider names the variable
// (env_key) it reads the bearer token from.

// ClientProviderID names gpuhost in a client's config (Codex's
// model_providers key).
const ClientProviderID = "gpuhost"

// usableModels keeps the models with working tool calls, in the daemon's
// order (the loaded model first), and says why the others are left out.
func usableModels(models []OpencodeModelInfo) ([]OpencodeModelInfo, []OpencodeSkipped, error) {
	var ok []OpencodeModelInfo
	var skipped []OpencodeSkipped
	seen := map[string]bool{}
	for _, m := range models {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		if sk, unusable := opencodeUnusable(m, 1); unusable {
			skipped = append(skipped, sk)
			continue
		}
		ok = append(ok, m)
	}
	if len(ok) == 0 {
		reasons := make([]string, 0, len(skipped))
		for _, s := range skipped {
			reasons = append(reasons, s.String())
		}
		if len(models) == 0 {
			reasons = append(reasons, "the daemon serves no models")
		}
		return nil, skipped, fmt.Errorf("no model with tool calls: %s", strings.Join(reasons, "; "))
	}
	return ok, skipped, nil
}

// clientRoot checks the daemon URL and returns it without /v1 (Claude Code
// appends /v1/messages itself).
func clientRoot(raw string) (string, error) {
	v1, err := opencodeBaseURL(raw)
	if err != nil {
		return "", err
	}
	u, _ := url.Parse(v1)
	u.Path = strings.TrimSuffix(u.Path, "/v1")
	return u.String(), nil
}

// ClaudeCodeEnv is the "env" block for Claude Code: the base URL, the
// model (the first usable one: the loaded model when it can), the same
// model as its small/fast one (a second model would make every turn switch
// the GPU), and no telemetry or other traffic beyond the box. loopback
// true writes a placeholder token (the daemon asks none there; Claude Code
// wants one set); otherwise no token is written.
func ClaudeCodeEnv(baseURL string, models []OpencodeModelInfo, loopback bool) (map[string]string, []OpencodeSkipped, error) {
	root, err := clientRoot(baseURL)
	if err != nil {
		return nil, nil, err
	}
	ok, skipped, err := usableModels(models)
	if err != nil {
		return nil, skipped, fmt.Errorf("claude-code config: %w", err)
	}
	env := map[string]string{
		"ANTHROPIC_BASE_URL":                       root,
		"ANTHROPIC_MODEL":                          ok[0].ID,
		"ANTHROPIC_SMALL_FAST_MODEL":               ok[0].ID,
		"ANTHROPIC_DEFAULT_HAIKU_MODEL":            ok[0].ID,
		"DISABLE_TELEMETRY":                        "1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
	}
	if ok[0].Context > 0 {
		// Claude Code asks for 32,000 output tokens by default; with the
		// prompt of a coding session that exceeds a 32k context, and vLLM
		// refuses every request. The same share of the context as
		// opencode's output limit.
		env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = strconv.Itoa(outputLimit(ok[0].Context))
	}
	if loopback {
		env["ANTHROPIC_AUTH_TOKEN"] = "gpuhost-loopback"
	}
	return env, skipped, nil
}

// MergeClaudeCodeSettings sets env's keys in the "env" block of an
// existing settings.json, keeping every other key and variable. It refuses
// a file that is not a plain JSON object, and a file whose
// ANTHROPIC_AUTH_TOKEN or ANTHROPIC_API_KEY it would have to drop (a
// token set by hand is the user's). It returns the keys it changed.
func MergeClaudeCodeSettings(existing []byte, env map[string]string) ([]byte, []string, error) {
	doc := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(existing)) > 0 {
		if err := json.Unmarshal(existing, &doc); err != nil || doc == nil {
			if err == nil {
				err = errors.New("null")
			}
			return nil, nil, fmt.Errorf("claude-code settings: the existing file is not a plain JSON object (edit it by hand or move it away): %w", err)
		}
	}
	cur := map[string]any{}
	if raw, ok := doc["env"]; ok && string(bytes.TrimSpace(raw)) != "null" {
		if err := json.Unmarshal(raw, &cur); err != nil || cur == nil {
			return nil, nil, fmt.Errorf("claude-code settings: the existing key env is not a JSON object: %v", err)
		}
	}
	var changed []string
	for _, k := range sortedKeys(env) {
		if k == "ANTHROPIC_AUTH_TOKEN" {
			if _, set := cur[k]; set {
				continue // the user's own token stays
			}
		}
		if s, _ := cur[k].(string); s != env[k] {
			cur[k] = env[k]
			changed = append(changed, k)
		}
	}
	raw, err := json.Marshal(cur)
	if err != nil {
		return nil, nil, fmt.Errorf("claude-code settings: encode: %w", err)
	}
	doc["env"] = raw
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("claude-code settings: encode: %w", err)
	}
	return append(out, '\n'), changed, nil
}

// CodexProvider is the Codex model_providers entry for gpuhost and the
// model to select: the first usable one. apiKeyEnv, when set, is the
// variable Codex reads the bearer token from (beyond loopback).
func CodexProvider(baseURL string, models []OpencodeModelInfo, apiKeyEnv string) (map[string]any, string, []OpencodeSkipped, error) {
	base, err := opencodeBaseURL(baseURL)
	if err != nil {
		return nil, "", nil, err
	}
	if apiKeyEnv != "" && !envNameRE.MatchString(apiKeyEnv) {
		return nil, "", nil, fmt.Errorf("codex config: api key variable %q is not an environment variable name", apiKeyEnv)
	}
	ok, skipped, err := usableModels(models)
	if err != nil {
		return nil, "", skipped, fmt.Errorf("codex config: %w", err)
	}
	prov := map[string]any{"name": "gpuhost", "base_url": base, "wire_api": "responses"}
	if apiKeyEnv != "" {
		prov["env_key"] = apiKeyEnv
	}
	return prov, ok[0].ID, skipped, nil
}

// MergeCodexConfig puts the gpuhost provider into an existing config.toml
// and selects it (model, model_provider); every other key and provider is
// kept (comments are not: the caller keeps the old file as .bak). A file
// that is not valid TOML is refused, never overwritten.
func MergeCodexConfig(existing []byte, prov map[string]any, model string) ([]byte, error) {
	doc := map[string]any{}
	if len(bytes.TrimSpace(existing)) > 0 {
		if err := toml.Unmarshal(existing, &doc); err != nil {
			return nil, fmt.Errorf("codex config: the existing file is not valid TOML (edit it by hand or move it away): %w", err)
		}
	}
	providers := map[string]any{}
	if raw, ok := doc["model_providers"]; ok {
		m, isTable := raw.(map[string]any)
		if !isTable {
			return nil, fmt.Errorf("codex config: the existing key model_providers is not a table")
		}
		providers = m
	}
	providers[ClientProviderID] = prov
	doc["model_providers"] = providers
	doc["model"] = model
	doc["model_provider"] = ClientProviderID
	out, err := toml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("codex config: encode: %w", err)
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
