package simulator

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// Anthropic Messages and OpenAI Responses, served by both flavours (vLLM
// and Ollama 0.14+ serve both). Each request is translated into the chat
// plan (agentreq.go); its tokens are then written in the API's documented
// shape: Messages streams message_start, content_block_start/_delta/_stop
// per text or tool_use block, message_delta (stop_reason, cumulative
// output_tokens) and message_stop; Responses streams response.created,
// response.in_progress, per output item output_item.added, the text's
// content_part.added / output_text.delta / output_text.done /
// content_part.done or the call's function_call_arguments.delta / .done,
// output_item.done, and response.completed with the usage. The usage is the
// chat plan's: the prompt tokens and the tokens emitted.

// agentReply collects a planned reply token by token, as text or as the
// arguments of each tool call, and tells which block a token opens.
type agentReply struct {
	j    *openAIJob
	id   string
	text strings.Builder
	args []strings.Builder
}

func newAgentReply(j *openAIJob, id string) *agentReply {
	return &agentReply{j: j, id: id, args: make([]strings.Builder, len(j.toolCalls))}
}

// token records token i and returns it with its tool call (-1 for text)
// and whether it starts a new block.
func (a *agentReply) token(i int) (tok string, call int, starts bool) {
	j := a.j
	switch {
	case j.toolCalls != nil:
		tok, call = j.toolCallToks[i], j.toolCallOf[i]
		a.args[call].WriteString(tok)
		return tok, call, i == 0 || j.toolCallOf[i-1] != call
	case j.textToks != nil:
		tok = j.textToks[i]
	default:
		tok = replyToken(i)
	}
	a.text.WriteString(tok)
	return tok, -1, i == 0
}

// callID is tool call k's id in the API's style.
func (a *agentReply) callID(prefix string, k int) string {
	return prefix + strings.TrimPrefix(toolCallIDN(a.id, k), "chatcmpl-tool-")
}

// writeAnthropicError writes Anthropic's error shape.
func writeAnthropicError(w http.ResponseWriter, e *apiError) {
	typ := "api_error"
	switch e.status {
	case http.StatusBadRequest:
		typ = "invalid_request_error"
	case http.StatusNotFound:
		typ = "not_found_error"
	case http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case http.StatusServiceUnavailable:
		typ = "overloaded_error"
	}
	writeJSON(w, e.status, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": e.message}})
}

// prepareAgent plans a translated chat body, failing with the error a
// stream would otherwise end with.
func (s *server) prepareAgent(chat []byte) (*openAIJob, *apiError) {
	j, e := s.prepareChat(chat)
	if e != nil {
		return nil, e
	}
	j.usageFinal, j.usageAlways = false, false
	return j, nil
}

func (s *server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e == nil {
		var chat []byte
		if _, chat, e = chatFromMessages(body, true); e == nil {
			var j *openAIJob
			if j, e = s.prepareAgent(chat); e == nil {
				writeJSON(w, http.StatusOK, map[string]any{"input_tokens": j.job.promptTokens})
				return
			}
		}
	}
	writeAnthropicError(w, e)
}

func (s *server) handleMessages(w http.ResponseWriter, r *http.Request) {
	if s.sleepGate(w) {
		return
	}
	body, e := readBody(w, r)
	var chat []byte
	if e == nil {
		_, chat, e = chatFromMessages(body, false)
	}
	var j *openAIJob
	if e == nil {
		j, e = s.prepareAgent(chat)
	}
	if e != nil {
		writeAnthropicError(w, e)
		return
	}
	a := newAgentReply(j, randomID("msg_"))
	var st *streamWriter
	open := -2 // the open block: -2 none, -1 text, k tool call k
	blocks := 0
	if j.stream {
		st = newStream(w, true)
		_ = st.sendEvent("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": a.id, "type": "message", "role": "assistant", "content": []any{}, "model": j.model,
			"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": j.job.promptTokens, "output_tokens": 0}}})
	}
	closeBlock := func() error {
		if open == -2 {
			return nil
		}
		open = -2
		blocks++
		return st.sendEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": blocks - 1})
	}
	res, err := s.generate(r.Context(), j.job, func(i int) error {
		tok, call, starts := a.token(i)
		if st == nil {
			return nil
		}
		if starts || open == -2 {
			if err := closeBlock(); err != nil {
				return err
			}
			open = call
			block := map[string]any{"type": "text", "text": ""}
			if call >= 0 {
				block = map[string]any{"type": "tool_use", "id": a.callID("toolu_", call), "name": j.toolCalls[call].Name, "input": map[string]any{}}
			}
			if err := st.sendEvent("content_block_start", map[string]any{"type": "content_block_start", "index": blocks, "content_block": block}); err != nil {
				return err
			}
		}
		delta := map[string]any{"type": "text_delta", "text": tok}
		if call >= 0 {
			delta = map[string]any{"type": "input_json_delta", "partial_json": tok}
		}
		return st.sendEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": blocks, "delta": delta})
	})
	if err != nil && !errors.Is(err, errSleepAbort) {
		s.log.Debug("generation ended early", "id", a.id, "emitted", res.emitted, "err", err)
		return
	}
	stop := anthStopReason(j)
	if st == nil {
		writeJSON(w, http.StatusOK, map[string]any{"id": a.id, "type": "message", "role": "assistant", "model": j.model,
			"content": a.anthContent(), "stop_reason": stop, "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": j.job.promptTokens, "output_tokens": res.emitted}})
		return
	}
	if closeBlock() != nil {
		return
	}
	if st.sendEvent("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": res.emitted}}) != nil {
		return
	}
	_ = st.sendEvent("message_stop", map[string]any{"type": "message_stop"})
}

// anthStopReason is the plan's finish in Anthropic's words.
func anthStopReason(j *openAIJob) string {
	switch {
	case j.finish == "length":
		return "max_tokens"
	case j.toolCalls != nil:
		return "tool_use"
	}
	return "end_turn"
}

// anthContent is a whole answer's content blocks.
func (a *agentReply) anthContent() []any {
	if a.j.toolCalls == nil {
		return []any{map[string]any{"type": "text", "text": a.text.String()}}
	}
	out := []any{}
	for k, c := range a.j.toolCalls {
		args := a.args[k].String()
		if k > 0 && args == "" {
			break // cut off by max_tokens before this call began
		}
		var input any = map[string]any{}
		_ = json.Unmarshal([]byte(args), &input)
		out = append(out, map[string]any{"type": "tool_use", "id": a.callID("toolu_", k), "name": c.Name, "input": input})
	}
	return out
}
