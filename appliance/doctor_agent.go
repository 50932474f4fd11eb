package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/internal/sse"
	"gpuhost/units"
)

// The checks in this file ask the active backend what an agent needs, not
// only whether it answers: a parser flag in the argv is no proof that tool
// calls come back structured, and a profile's context is no proof of the
// served one.

const (
	// doctorProbeTool is the one tool the endpoint.tool_calls probe offers.
	doctorProbeTool = "gpuhost_doctor_probe"
	// doctorProbeTimeout bounds each probe request, doctorAgentBudget all
	// of them together (three small requests; a healthy backend answers in
	// well under a second each).
	doctorProbeTimeout = 10 * time.Second
	doctorAgentBudget  = 20 * time.Second
	// doctorProbeMaxBody bounds what a probe reads of an answer.
	doctorProbeMaxBody = 1 << 20
)

// agentChecks runs endpoint.tool_calls and endpoint.context against the
// active, healthy backend of profile p.
func (d *Doctor) agentChecks(ctx context.Context, act backendState, p *units.Profile) []api.DoctorCheck {
	ctx, cancel := context.WithTimeout(ctx, doctorAgentBudget)
	defer cancel()
	client := backendClient(d.Cfg)
	base := "http://127.0.0.1:" + fmt.Sprint(p.Port)
	return []api.DoctorCheck{
		toolCallsCheck(ctx, client, base, act, p),
		contextCheck(ctx, client, base, p),
	}
}

// toolProbeCache holds the last endpoint.tool_calls verdict of one
// backend process: how a running server answers tool calls does not change
// until it restarts, so the background doctor (every minute) probes once
// per backend start instead of sending the GPU two requests a minute that
// would also disturb a running benchmark. Only verdicts from answers are
// kept; a request that failed (timeout, refused) is asked again next run.
var toolProbeCache probeCache

// probeCache keeps one endpoint probe's verdict for one backend process.
// A verdict read from it says how old it is: the backend may have been
// changed by hand since (a sleep and wake through its port keeps its PID),
// so a kept verdict is never shown as if it had just been asked.
type probeCache struct {
	sync.Mutex
	key   string
	at    time.Time
	check api.DoctorCheck
}

// get returns the verdict kept for key, its message saying when it was
// probed.
func (pc *probeCache) get(key string) (api.DoctorCheck, bool) {
	pc.Lock()
	defer pc.Unlock()
	if key == "" || pc.key != key {
		return api.DoctorCheck{}, false
	}
	c := pc.check
	c.Message += fmt.Sprintf(" (probed %s ago, at %s, once per backend process)",
		time.Since(pc.at).Round(time.Second), pc.at.Local().Format("15:04:05"))
	return c, true
}

func (pc *probeCache) put(key string, c api.DoctorCheck) {
	pc.Lock()
	defer pc.Unlock()
	pc.key, pc.at, pc.check = key, time.Now(), c
}

// toolProbeKey names the backend process and what it serves; "" when the
// process is not known (no cache).
func toolProbeKey(act backendState, p *units.Profile, ts toolSetting) string {
	if act.status.MainPID <= 0 {
		return ""
	}
	return fmt.Sprintf("%s|%d|%s|%s|%s|%s|%v|%s", act.unit, act.status.MainPID, p.Name, p.ServedModelName(), p.Model, ts.source, ts.auto, ts.parser)
}

// toolProbeHook, when set (tests only), runs just before the tool-call
// probe's first request: a barrier that lets a test start a switch while a
// probe is under way, the race probe leases exist for.
var toolProbeHook func(ctx context.Context)

// toolSetting is how the running backend is set up for tool calls.
type toolSetting struct {
	auto   bool   // vLLM --enable-auto-tool-choice (Ollama: always)
	parser string // vLLM --tool-call-parser; "" for Ollama
	source string // "argv" or "profile"
}

func liveToolSetting(act backendState, p *units.Profile) toolSetting {
	if p.Backend != units.VLLM {
		return toolSetting{auto: true, source: "ollama"}
	}
	ts := toolSetting{auto: p.VLLM.EnableAutoToolChoice, parser: p.VLLM.ToolCallParser, source: "profile"}
	if act.status.MainPID > 0 {
		if argv, err := cmdlineWithRetry(act.status.MainPID); err == nil {
			if live, err := units.ParseVLLMArgv(argv); err == nil {
				ts = toolSetting{auto: live.Flags.EnableAutoToolChoice, parser: live.Flags.ToolCallParser, source: "argv"}
			}
		}
	}
	return ts
}

func (ts toolSetting) String() string {
	if ts.source == "ollama" {
		return "Ollama (the model's template)"
	}
	return fmt.Sprintf("parser %s (%s)", orDash(ts.parser), ts.source)
}

func orDash(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}

// toolCallsCheck sends one small chat request with one tool and
// tool_choice auto, once whole and once streamed, and passes only when both
// come back as a structured tool_calls entry with JSON object arguments.
func toolCallsCheck(ctx context.Context, client *http.Client, base string, act backendState, p *units.Profile) (c api.DoctorCheck) {
	ts := liveToolSetting(act, p)
	c = api.DoctorCheck{ID: "endpoint.tool_calls", Profile: p.Name, Value: ts.parser}
	if ts.source == "ollama" {
		c.Value = "ollama"
	}
	if !ts.auto {
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("profile %s has no tool calling (no --enable-auto-tool-choice in the %s): agents that send tools, such as opencode, get a 400 on every prompt", p.Name, ts.source)
		c.Fix = "set vllm.enable_auto_tool_choice: true and the model's vllm.tool_call_parser (qwen3_xml for Qwen3-Coder, hermes for Qwen2.5/Qwen3), then `gpuhost switch " + p.Name + "`"
		return c
	}
	key := toolProbeKey(act, p, ts)
	if cached, hit := toolProbeCache.get(key); hit {
		return cached
	}
	if toolProbeHook != nil {
		toolProbeHook(ctx)
	}
	sevW, whole, answeredW := probeToolCall(ctx, client, base, p.ServedModelName(), false)
	sevS, streamed, answeredS := probeToolCall(ctx, client, base, p.ServedModelName(), true)
	if key != "" && answeredW && answeredS {
		defer func() { toolProbeCache.put(key, c) }()
	}
	worst := sevW
	if rank(sevS) > rank(worst) {
		worst = sevS
	}
	c.Severity = worst
	if whole == streamed {
		c.Message = ts.String() + ": whole and streamed: " + whole
	} else {
		c.Message = ts.String() + ": whole: " + whole + "; streamed: " + streamed
	}
	switch worst {
	case units.SeverityFail:
		if p.Backend == units.VLLM {
			c.Fix = "the tool-call parser does not match the model's output format: set vllm.tool_call_parser to the model's (qwen3_xml for Qwen3-Coder, hermes for Qwen2.5/Qwen3) and `gpuhost switch " + p.Name + "`"
		} else {
			c.Fix = "use an Ollama model whose template supports tools (`ollama show " + p.Model + "` lists the capability \"tools\")"
		}
	case units.SeverityWarn:
		c.Fix = "for agents use an Ollama model whose template supports tools (`ollama show " + p.Model + "` lists \"tools\" under Capabilities)"
	}
	return c
}

func rank(s units.Severity) int {
	switch s {
	case units.SeverityFail:
		return 2
	case units.SeverityWarn:
		return 1
	}
	return 0
}

// toolReply is what one probe saw.
type toolReply struct {
	content string
	names   []string
	args    []string
}

// probeToolCall sends the probe and says what came back; answered is
// false when no answer came (the verdict is not worth keeping).
func probeToolCall(ctx context.Context, client *http.Client, base, model string, stream bool) (sev units.Severity, observed string, answered bool) {
	ctx, cancel := context.WithTimeout(ctx, doctorProbeTimeout)
	defer cancel()
	body := map[string]any{
		"model": model, "stream": stream, "max_tokens": 256, "temperature": 0, "tool_choice": "auto",
		"messages": []any{map[string]any{"role": "user", "content": "This is a test of tool calling. Call the function " +
			doctorProbeTool + " with status \"ok\". Answer only with the tool call."}},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{
			"name": doctorProbeTool, "description": "Report a status word to the gpuhost doctor.",
			"parameters": map[string]any{"type": "object", "required": []any{"status"},
				"properties": map[string]any{"status": map[string]any{"type": "string"}}}}}},
	}
	b, err := json.Marshal(body)
	if err != nil {
		return units.SeverityFail, "cannot encode the probe: " + err.Error(), false
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return units.SeverityFail, "cannot build the probe: " + err.Error(), false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return units.SeverityFail, "request failed: " + err.Error(), false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		text := excerpt(errorMessage(msg), 200)
		if strings.Contains(text, "does not support tools") {
			return units.SeverityWarn, "the model has no tool calling: " + text, true
		}
		return units.SeverityFail, fmt.Sprintf("status %d: %s", resp.StatusCode, text), resp.StatusCode < 500
	}
	var r toolReply
	if stream {
		r, err = readStreamedReply(resp.Body)
	} else {
		r, err = readWholeReply(resp.Body)
	}
	if err != nil {
		return units.SeverityFail, "cannot read the answer: " + err.Error(), false
	}
	sev, observed = judgeToolReply(r)
	return sev, observed, true
}

// judgeToolReply passes one structured call of the probe tool with a JSON
// object as arguments, and names what came back otherwise.
func judgeToolReply(r toolReply) (units.Severity, string) {
	content := strings.TrimSpace(r.content)
	if len(r.names) > 0 {
		if r.names[0] != doctorProbeTool {
			return units.SeverityFail, fmt.Sprintf("called %q, not the offered %s", r.names[0], doctorProbeTool)
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(r.args[0]), &obj); err != nil {
			return units.SeverityFail, fmt.Sprintf("tool_calls arguments are not a JSON object: %q", excerpt(r.args[0], 120))
		}
		return units.SeverityOK, fmt.Sprintf("structured tool_calls %s(%s)", r.names[0], excerpt(r.args[0], 80))
	}
	switch {
	case content == "":
		return units.SeverityFail, "empty reply: no tool_calls and no content"
	case strings.Contains(content, "<tool_call") || strings.Contains(content, "<function="):
		return units.SeverityFail, fmt.Sprintf("the tool call came back as XML text in content, not as tool_calls: %q", excerpt(content, 120))
	case strings.Contains(content, doctorProbeTool) || strings.HasPrefix(content, "{") || strings.HasPrefix(content, "["):
		return units.SeverityFail, fmt.Sprintf("the tool call came back as JSON text in content, not as tool_calls: %q", excerpt(content, 120))
	}
	return units.SeverityFail, fmt.Sprintf("answered in text without calling the tool: %q", excerpt(content, 120))
}

// errorMessage is the message of an error body: OpenAI's and Ollama's
// {"error": {"message": …}}, Ollama's {"error": "…"}, vLLM's
// {"object": "error", "message": …}; else the body itself.
func errorMessage(body []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(e.Error, &inner) == nil && inner.Message != "":
			return inner.Message
		case json.Unmarshal(e.Error, &s) == nil && s != "":
			return s
		case e.Message != "":
			return e.Message
		}
	}
	return string(body)
}

func excerpt(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

type chatToolCall struct {
	Index    int `json:"index"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func readWholeReply(body io.Reader) (toolReply, error) {
	var resp struct {
		Choices []struct {
			Message struct {
				Content   *string        `json:"content"`
				ToolCalls []chatToolCall `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(io.LimitReader(body, doctorProbeMaxBody)).Decode(&resp); err != nil {
		return toolReply{}, fmt.Errorf("decode chat completion: %w", err)
	}
	if len(resp.Choices) == 0 {
		return toolReply{}, errors.New("chat completion without choices")
	}
	var r toolReply
	m := resp.Choices[0].Message
	if m.Content != nil {
		r.content = *m.Content
	}
	for _, tc := range m.ToolCalls {
		r.names, r.args = append(r.names, tc.Function.Name), append(r.args, tc.Function.Arguments)
	}
	return r, nil
}

// readStreamedReply folds SSE chunks: content concatenated, tool calls
// assembled by index.
func readStreamedReply(body io.Reader) (toolReply, error) {
	var r toolReply
	rd := sse.NewReader(io.LimitReader(body, doctorProbeMaxBody), doctorProbeMaxBody)
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, sse.ErrIncomplete) {
			return r, fmt.Errorf("read stream: %w", err)
		}
		data := bytes.TrimSpace(ev.Data)
		if string(data) == "[DONE]" {
			return r, nil
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content   *string        `json:"content"`
					ToolCalls []chatToolCall `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return r, fmt.Errorf("decode stream chunk: %w", err)
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != nil {
				r.content += *ch.Delta.Content
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Index < 0 || tc.Index > 16 {
					return r, fmt.Errorf("stream chunk with tool call index %d", tc.Index)
				}
				for len(r.names) <= tc.Index {
					r.names, r.args = append(r.names, ""), append(r.args, "")
				}
				r.names[tc.Index] += tc.Function.Name
				r.args[tc.Index] += tc.Function.Arguments
			}
		}
		if err != nil { // the stream ended inside this event
			break
		}
	}
	return r, errors.New("stream ended without [DONE]")
}

// contextCheck compares the served context with the profile's: vLLM's
// /v1/models max_model_len, Ollama's /api/ps context_length.
func contextCheck(ctx context.Context, client *http.Client, base string, p *units.Profile) api.DoctorCheck {
	c := api.DoctorCheck{ID: "endpoint.context", Profile: p.Name}
	ctx, cancel := context.WithTimeout(ctx, doctorProbeTimeout)
	defer cancel()
	var served, want int
	switch p.Backend {
	case units.VLLM:
		want = p.VLLM.MaxModelLen
		var models struct {
			Data []struct {
				ID          string `json:"id"`
				MaxModelLen int    `json:"max_model_len"`
			} `json:"data"`
		}
		if err := backend.GetJSON(ctx, client, base+"/v1/models", &models); err != nil {
			c.Severity, c.Message = units.SeverityFail, "cannot read the served context: "+err.Error()
			return c
		}
		for _, m := range models.Data {
			if m.ID == p.ServedModelName() {
				served = m.MaxModelLen
			}
		}
	case units.Ollama:
		want = p.Ollama.NumCtx
		if want == 0 {
			want = units.OllamaDefaultNumCtx
		}
		var ps struct {
			Models []struct {
				Name          string `json:"name"`
				Model         string `json:"model"`
				ContextLength int    `json:"context_length"`
			} `json:"models"`
		}
		if err := backend.GetJSON(ctx, client, base+"/api/ps", &ps); err != nil {
			c.Severity, c.Message = units.SeverityFail, "cannot read the served context: "+err.Error()
			return c
		}
		for _, m := range ps.Models {
			if backend.SameOllamaModel(m.Name, p.Model) || backend.SameOllamaModel(m.Model, p.Model) {
				served = m.ContextLength
			}
		}
	}
	c.Value = fmt.Sprint(served)
	switch {
	case served == 0:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("the backend does not report the served context of %s; the profile's is %s", p.ServedModelName(), ctxText(want))
	case want == 0:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("serves %d tokens of context (the model's default; the profile sets none)", served)
	case served == want:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("serves %d tokens of context, as the profile says", served)
	default:
		c.Severity = units.SeverityWarn
		if served < want {
			c.Severity = units.SeverityFail
		}
		c.Message = fmt.Sprintf("serves %d tokens of context, the profile says %d: clients sized by the profile overflow or waste it", served, want)
		c.Fix = "`gpuhost switch " + p.Name + "` restarts the backend with the profile's context"
	}
	return c
}

func ctxText(n int) string {
	if n == 0 {
		return "the model's default"
	}
	return fmt.Sprint(n)
}
