package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/units"
)

// endpoint.apis: which of the agent APIs the active backend serves, by a
// tool-call round trip through each (Anthropic Messages for Claude Code,
// OpenAI Responses for Codex). gpuhost passes them through untranslated,
// so a backend that lacks one (an Ollama before 0.14 / 0.13.3, an older
// vLLM) leaves those clients without service: a warning with the fix.
// Like endpoint.tool_calls, the verdict is kept per backend process.

var apisProbeCache probeCache

// apisCheck probes /v1/messages and /v1/responses of profile p's running
// backend with one tool each.
func (d *Doctor) apisCheck(ctx context.Context, act backendState, p *units.Profile) api.DoctorCheck {
	key := toolProbeKey(act, p, liveToolSetting(act, p))
	if cached, hit := apisProbeCache.get(key); hit {
		return cached
	}
	ctx, cancel := context.WithTimeout(ctx, doctorAgentBudget)
	defer cancel()
	client := backendClient(d.Cfg)
	base := fmt.Sprintf("http://127.0.0.1:%d", p.Port)
	model := p.ServedModelName()
	if p.Backend == units.Ollama {
		model = p.Model
	}
	tool := map[string]any{"type": "object", "required": []any{"status"}, "properties": map[string]any{"status": map[string]any{"type": "string"}}}
	prompt := "This is a test of tool calling. Call the function " + doctorProbeTool + " with status \"ok\". Answer only with the tool call."
	probes := []struct {
		name, path, call string
		body             map[string]any
	}{
		{"messages", "/v1/messages", `"tool_use"`, map[string]any{"model": model, "max_tokens": 256, "temperature": 0,
			"messages": []any{map[string]any{"role": "user", "content": prompt}},
			"tools":    []any{map[string]any{"name": doctorProbeTool, "description": "Report a status word to the gpuhost doctor.", "input_schema": tool}}}},
		{"responses", "/v1/responses", `"function_call"`, map[string]any{"model": model, "max_output_tokens": 256, "temperature": 0, "input": prompt,
			"tools": []any{map[string]any{"type": "function", "name": doctorProbeTool, "description": "Report a status word to the gpuhost doctor.", "parameters": tool}}}},
	}
	c := api.DoctorCheck{ID: "endpoint.apis", Profile: p.Name, Severity: units.SeverityOK}
	var served, missing, notes []string
	answered := true
	for _, pr := range probes {
		status, text, err := probeAPI(ctx, client, base+pr.path, pr.body)
		switch {
		case err != nil:
			answered = false
			notes = append(notes, pr.name+": "+err.Error())
		case status == http.StatusNotFound && text == "":
			missing = append(missing, pr.name)
		case status != http.StatusOK:
			notes = append(notes, fmt.Sprintf("%s: %d %s", pr.name, status, excerpt(errorMessage([]byte(text)), 160)))
			served = append(served, pr.name)
		case !strings.Contains(text, pr.call):
			notes = append(notes, pr.name+": answered without a tool call")
			served = append(served, pr.name)
		default:
			served = append(served, pr.name+" (tool call ok)")
		}
	}
	c.Value = strings.Join(served, ", ")
	c.Message = fmt.Sprintf("%s serves chat completions and: %s", p.Name, orDash(c.Value))
	if len(missing) > 0 || len(notes) > 0 {
		c.Severity = units.SeverityWarn
	}
	if len(missing) > 0 {
		c.Message += fmt.Sprintf("; not served: %s (Claude Code needs messages, the Codex CLI responses)", strings.Join(missing, ", "))
		c.Fix = fmt.Sprintf("use a %s release that serves them (vLLM: a current release; Ollama: 0.14 or later)", p.Backend)
	}
	if len(notes) > 0 {
		c.Message += "; " + strings.Join(notes, "; ")
	}
	if key != "" && answered {
		apisProbeCache.put(key, c)
	}
	return c
}

// probeAPI posts one probe and returns the status and (bounded) body.
func probeAPI(ctx context.Context, client *http.Client, url string, body map[string]any) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, doctorProbeTimeout)
	defer cancel()
	b, err := json.Marshal(body)
	if err != nil {
		return 0, "", fmt.Errorf("encode the probe: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, "", fmt.Errorf("build the probe: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("request failed: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, doctorProbeMaxBody))
	if err != nil {
		return 0, "", fmt.Errorf("read the answer: %w", err)
	}
	if backend.RouterNotFound(resp.StatusCode, resp.Header.Get("Content-Type"), data) {
		return http.StatusNotFound, "", nil // the router's: the API is not served
	}
	return resp.StatusCode, string(data), nil
}
