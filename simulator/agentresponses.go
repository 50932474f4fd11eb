package simulator

import (
	"errors"
	"net/http"
	"time"
)

// respStream writes a Responses event stream: every event carries its
// type and a sequence_number.
type respStream struct {
	st  *streamWriter
	seq int
}

func (rs *respStream) send(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = rs.seq
	rs.seq++
	return rs.st.sendEvent(typ, fields)
}

func (s *server) handleResponses(w http.ResponseWriter, r *http.Request) {
	if s.sleepGate(w) {
		return
	}
	body, e := readBody(w, r)
	var chat []byte
	if e == nil {
		_, chat, e = chatFromResponses(body)
	}
	var j *openAIJob
	if e == nil {
		j, e = s.prepareAgent(chat)
	}
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	a := newAgentReply(j, randomID("resp_"))
	created := time.Now().Unix()
	var rs *respStream
	if j.stream {
		rs = &respStream{st: newStream(w, true)}
		shell := a.respObject(created, "in_progress", nil, 0)
		if rs.send("response.created", map[string]any{"response": shell}) != nil ||
			rs.send("response.in_progress", map[string]any{"response": shell}) != nil {
			return
		}
	}
	open, items := -2, 0 // the open item (-2 none, -1 message, k call k) and the items begun
	closeItem := func() error {
		if open == -2 {
			return nil
		}
		k := open
		open = -2
		return a.respItemDone(rs, items-1, k)
	}
	res, err := s.generate(r.Context(), j.job, func(i int) error {
		tok, call, starts := a.token(i)
		if rs == nil {
			return nil
		}
		if starts || open == -2 {
			if err := closeItem(); err != nil {
				return err
			}
			open = call
			items++
			if err := a.respItemAdded(rs, items-1, call); err != nil {
				return err
			}
		}
		if call >= 0 {
			return rs.send("response.function_call_arguments.delta", map[string]any{"item_id": a.callID("fc_", call), "output_index": items - 1, "delta": tok})
		}
		return rs.send("response.output_text.delta", map[string]any{"item_id": a.msgID(), "output_index": items - 1, "content_index": 0, "delta": tok, "logprobs": []any{}})
	})
	if err != nil && !errors.Is(err, errSleepAbort) {
		s.log.Debug("generation ended early", "id", a.id, "emitted", res.emitted, "err", err)
		return
	}
	status := "completed"
	if j.finish == "length" {
		status = "incomplete"
	}
	final := a.respObject(created, status, a.respOutput(), res.emitted)
	if rs == nil {
		writeJSON(w, http.StatusOK, final)
		return
	}
	if closeItem() != nil {
		return
	}
	_ = rs.send("response."+status, map[string]any{"response": final})
}

func (a *agentReply) msgID() string { return "msg_" + a.id[len("resp_"):] }

// respObject is the response object; usage only once the reply is done.
func (a *agentReply) respObject(created int64, status string, output []any, emitted int) map[string]any {
	if output == nil {
		output = []any{}
	}
	o := map[string]any{"id": a.id, "object": "response", "created_at": created, "status": status, "model": a.j.model,
		"output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}, "usage": nil,
		"incomplete_details": nil, "error": nil}
	if status != "in_progress" {
		o["usage"] = map[string]any{"input_tokens": a.j.job.promptTokens, "output_tokens": emitted,
			"total_tokens":         a.j.job.promptTokens + emitted,
			"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	}
	if status == "incomplete" {
		o["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	}
	return o
}

// respMessageItem and respCallItem are the output items, as far as emitted.
func (a *agentReply) respMessageItem(status string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = []any{map[string]any{"type": "output_text", "text": a.text.String(), "annotations": []any{}}}
	}
	return map[string]any{"id": a.msgID(), "type": "message", "status": status, "role": "assistant", "content": content}
}

func (a *agentReply) respCallItem(k int, status string) map[string]any {
	args := ""
	if status == "completed" {
		args = a.args[k].String()
	}
	return map[string]any{"id": a.callID("fc_", k), "type": "function_call", "status": status,
		"call_id": a.callID("call_", k), "name": a.j.toolCalls[k].Name, "arguments": args}
}

// respOutput is a finished reply's output items.
func (a *agentReply) respOutput() []any {
	if a.j.toolCalls == nil {
		return []any{a.respMessageItem("completed")}
	}
	var out []any
	for k := range a.j.toolCalls {
		if k > 0 && a.args[k].Len() == 0 {
			break // cut off by max_output_tokens before this call began
		}
		out = append(out, a.respCallItem(k, "completed"))
	}
	return out
}

// respItemAdded opens output item idx: a message with its text part, or
// tool call k.
func (a *agentReply) respItemAdded(rs *respStream, idx, k int) error {
	if k >= 0 {
		return rs.send("response.output_item.added", map[string]any{"output_index": idx, "item": a.respCallItem(k, "in_progress")})
	}
	if err := rs.send("response.output_item.added", map[string]any{"output_index": idx, "item": a.respMessageItem("in_progress")}); err != nil {
		return err
	}
	return rs.send("response.content_part.added", map[string]any{"item_id": a.msgID(), "output_index": idx, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
}

// respItemDone closes output item idx.
func (a *agentReply) respItemDone(rs *respStream, idx, k int) error {
	if k >= 0 {
		if err := rs.send("response.function_call_arguments.done", map[string]any{"item_id": a.callID("fc_", k), "output_index": idx,
			"arguments": a.args[k].String()}); err != nil {
			return err
		}
		return rs.send("response.output_item.done", map[string]any{"output_index": idx, "item": a.respCallItem(k, "completed")})
	}
	text := a.text.String()
	if err := rs.send("response.output_text.done", map[string]any{"item_id": a.msgID(), "output_index": idx, "content_index": 0, "text": text, "logprobs": []any{}}); err != nil {
		return err
	}
	if err := rs.send("response.content_part.done", map[string]any{"item_id": a.msgID(), "output_index": idx, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}); err != nil {
		return err
	}
	return rs.send("response.output_item.done", map[string]any{"output_index": idx, "item": a.respMessageItem("completed")})
}
