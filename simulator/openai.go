package simulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// OpenAI-compatible endpoints, served by both flavours with each server's
// small differences: vLLM sends a role-only first chunk and puts
// finish_reason on the last token's chunk, reports stop_reason and a numeric
// error code; Ollama repeats the role in every delta, ends with an empty
// delta carrying finish_reason, and adds system_fingerprint "fp_ollama".

type oaiUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

func usageOf(prompt, completion int) *oaiUsage {
	return &oaiUsage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

type oaiFunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type oaiToolCallDelta struct {
	Index    int              `json:"index"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function oaiFunctionDelta `json:"function"`
}

type oaiDelta struct {
	Role      string             `json:"role,omitempty"`
	Content   *string            `json:"content,omitempty"`
	ToolCalls []oaiToolCallDelta `json:"tool_calls,omitempty"`
}

type oaiChunkChoice struct {
	Index        int             `json:"index"`
	Delta        *oaiDelta       `json:"delta,omitempty"`
	Text         *string         `json:"text,omitempty"`
	Logprobs     any             `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"`
}

type oaiChunk struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"`
	Created           int64            `json:"created"`
	Model             string           `json:"model"`
	SystemFingerprint string           `json:"system_fingerprint,omitempty"`
	Choices           []oaiChunkChoice `json:"choices"`
	Usage             *oaiUsage        `json:"usage,omitempty"`
}

var jsonNull = json.RawMessage("null")

// openAIJob is a validated completion or chat request ready to run.
type openAIJob struct {
	chat        bool
	model       string // reported model name
	stream      bool
	usageFinal  bool
	usageAlways bool
	job         genJob
	finish      string
	// toolCalls are the calls of a tool-calling reply (a forced
	// tool_choice, or the scripted mode's one or two calls); their argument
	// tokens are streamed one after the other, toolCallToks flat and
	// toolCallOf[i] the call token i belongs to.
	toolCalls    []forcedToolCall
	toolCallToks []string
	toolCallOf   []int
	// textToks, when set, is the exact reply (a structured-output JSON
	// document or a scripted answer) instead of the filler words.
	textToks []string
}

func (s *server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	if s.sleepGate(w) {
		return
	}
	body, e := readBody(w, r)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	job, e := s.prepareChat(body)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	s.runOpenAI(w, r, job)
}

func (s *server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	if s.sleepGate(w) {
		return
	}
	body, e := readBody(w, r)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	job, e := s.prepareCompletion(body)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	s.runOpenAI(w, r, job)
}

// prepareChat validates a chat body and plans its generation.
func (s *server) prepareChat(body []byte) (*openAIJob, *apiError) {
	req, e := decodeChatRequest(body)
	if e != nil {
		return nil, e
	}
	name, tag, e := s.resolveModel(req.Model)
	if e != nil {
		return nil, e
	}
	msgs, e := chatMessages(req.Messages)
	if e != nil {
		return nil, e
	}
	tc := toolChoice{Mode: "none"}
	if s.opts.Flavor == FlavorVLLM {
		// Ollama's /v1 ignores tool_choice; vLLM enforces it.
		if tc, e = decodeToolChoice(req.ToolChoice, req.Tools); e != nil {
			return nil, e
		}
		if tc.Mode == "auto" && !s.opts.EnableAutoToolChoice {
			return nil, badRequest("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set")
		}
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	promptTokens := len(tokenize(renderChat(msgs, compactTools(req.Tools), addGen)))
	maxTok, param := req.maxTokensOf()
	j := &openAIJob{chat: true, model: name, stream: req.Stream}
	j.usageFinal, j.usageAlways = includeUsage(req.StreamOptions)
	limit, promptTokens, e := s.tokenBudget(promptTokens, maxTok, param)
	if e != nil {
		return nil, e
	}
	j.job = genJob{tag: tag, keepAlive: s.opts.KeepAlive, promptTokens: promptTokens}
	scripted, isScripted := scriptedReply{}, false
	// vLLM offers the tools under "auto"; Ollama's /v1 whenever sent.
	offer := tc.Mode == "auto" || (s.opts.Flavor == FlavorOllama && !isNoneChoice(req.ToolChoice))
	if s.opts.ScriptedTools && tc.Mode != "required" && tc.Mode != "named" {
		scripted, isScripted = scriptedTurn(req, offer)
		if isScripted {
			s.logScripted(scripted)
		}
	}
	var calls []forcedToolCall
	if call := planToolCall(tc, req.Tools); call != nil {
		calls = []forcedToolCall{*call}
	} else if isScripted && len(scripted.calls) > 0 {
		calls = scripted.calls
	} else if !isScripted && offer {
		if call := namedToolCall(req); call != nil {
			calls = []forcedToolCall{*call}
		}
	}
	if len(calls) > 0 {
		if calls, text, asText := s.toolCallFault(calls); asText {
			j.planText(text, limit)
		} else {
			j.planToolCalls(calls, limit)
		}
	} else if isScripted {
		j.planText(scripted.text, limit)
	} else if text, ok, e := s.fixedReply(req, msgs); e != nil {
		return nil, e
	} else if ok {
		j.planText(text, limit)
	} else {
		j.job.tokens, j.finish = planTokens(s.opts.NaturalTokens, limit, req.MinTokens, req.IgnoreEOS)
	}
	j.job.finish = j.finish
	return j, nil
}

// planToolCalls makes the reply the given calls, cut at limit tokens
// (-1 = none) with finish "length" when the cap is shorter.
func (j *openAIJob) planToolCalls(calls []forcedToolCall, limit int) {
	j.toolCalls = calls
	j.toolCallToks, j.toolCallOf = nil, nil
	for k, c := range calls {
		toks := tokenize(c.Arguments)
		if len(toks) == 0 {
			toks = []string{""} // every call needs a chunk for its name
		}
		j.toolCallToks = append(j.toolCallToks, toks...)
		for range toks {
			j.toolCallOf = append(j.toolCallOf, k)
		}
	}
	j.job.tokens, j.finish = len(j.toolCallToks), calls[0].Finish
	if limit >= 0 && limit < len(j.toolCallToks) {
		j.job.tokens, j.finish = limit, "length"
	}
}

// planText makes the reply exactly text, cut at limit tokens.
func (j *openAIJob) planText(text string, limit int) {
	j.textToks = tokenize(text)
	j.job.tokens, j.finish = len(j.textToks), "stop"
	if limit >= 0 && limit < len(j.textToks) {
		j.job.tokens, j.finish = limit, "length"
	}
}

// isNoneChoice reports tool_choice "none".
func isNoneChoice(raw json.RawMessage) bool {
	var s string
	return json.Unmarshal(raw, &s) == nil && s == "none"
}

// prepareCompletion validates a text completion body and plans it.
func (s *server) prepareCompletion(body []byte) (*openAIJob, *apiError) {
	req, e := decodeCompletionRequest(body)
	if e != nil {
		return nil, e
	}
	name, tag, e := s.resolveModel(req.Model)
	if e != nil {
		return nil, e
	}
	_, promptTokens, e := completionPrompt(req.Prompt)
	if e != nil {
		return nil, e
	}
	if promptTokens == 0 && s.opts.Flavor == FlavorVLLM {
		return nil, badRequest("The decoder prompt cannot be empty")
	}
	j := &openAIJob{model: name, stream: req.Stream}
	j.usageFinal, j.usageAlways = includeUsage(req.StreamOptions)
	limit, promptTokens, e := s.tokenBudget(promptTokens, req.MaxTokens, "max_tokens")
	if e != nil {
		return nil, e
	}
	j.job = genJob{tag: tag, keepAlive: s.opts.KeepAlive, promptTokens: promptTokens}
	j.job.tokens, j.finish = planTokens(s.opts.NaturalTokens, limit, req.MinTokens, req.IgnoreEOS)
	j.job.finish = j.finish
	return j, nil
}

// resolveModel maps the request's model to the reported name and, for
// Ollama, the tag to load.
func (s *server) resolveModel(model string) (name, tag string, e *apiError) {
	if s.opts.Flavor == FlavorVLLM {
		if model == "" || model == s.opts.ServedName {
			return s.opts.ServedName, "", nil
		}
		for _, a := range s.opts.ServedNameAliases {
			if model == a {
				return a, "", nil
			}
		}
		return "", "", notFound("The model `%s` does not exist.", model)
	}
	if strings.TrimSpace(model) == "" {
		return "", "", badRequest("model is required")
	}
	t := normalizeTag(model)
	for _, m := range s.opts.Models {
		if m == t {
			return model, t, nil
		}
	}
	return "", "", notFound("model '%s' not found", model)
}

// tokenBudget checks the prompt against the context and returns the token
// cap (-1 = none) and the prompt length to use. vLLM refuses prompts and
// budgets that do not fit, with its own messages; Ollama truncates the prompt
// to num_ctx and treats max_tokens as num_predict.
func (s *server) tokenBudget(promptTokens int, maxTok *int, param string) (limit, prompt int, e *apiError) {
	ctxLen := s.opts.MaxModelLen
	if s.opts.Flavor == FlavorOllama {
		if promptTokens > ctxLen {
			s.log.Warn("truncating input prompt", "limit", ctxLen, "prompt", promptTokens)
			promptTokens = ctxLen
		}
		if maxTok == nil || *maxTok < 0 {
			return -1, promptTokens, nil
		}
		return *maxTok, promptTokens, nil
	}
	if promptTokens >= ctxLen {
		return 0, 0, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", ctxLen, promptTokens)
	}
	if maxTok == nil {
		return ctxLen - promptTokens, promptTokens, nil
	}
	if *maxTok < 1 {
		return 0, 0, badRequest("%s must be at least 1, got %d.", param, *maxTok)
	}
	if promptTokens+*maxTok > ctxLen {
		return 0, 0, badRequest("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			*maxTok, ctxLen, promptTokens, *maxTok, ctxLen, promptTokens)
	}
	return *maxTok, promptTokens, nil
}

// oaiReply is one OpenAI-compatible response being generated: its ids, the
// text and tool call arguments emitted so far, and the stream (nil when
// the response is written whole).
type oaiReply struct {
	j                       *openAIJob
	vllm                    bool
	id, object, fingerprint string
	created                 int64
	finish                  string
	text                    strings.Builder
	args                    []strings.Builder // per-call arguments emitted
	stream                  *streamWriter
	garbled                 bool // the output wake fault is armed
}

// runOpenAI generates and writes the response, streamed or whole.
func (s *server) runOpenAI(w http.ResponseWriter, r *http.Request, j *openAIJob) {
	vllm := s.opts.Flavor == FlavorVLLM
	rp := &oaiReply{j: j, vllm: vllm, garbled: s.activeWakeFault() == WakeFaultOutput}
	rp.id = randomID(pickS(j.chat, "chatcmpl-", "cmpl-"))
	rp.object = pickS(j.chat, "chat.completion", "text_completion")
	rp.created = time.Now().Unix()
	rp.fingerprint = pickS(vllm, "", "fp_ollama")
	rp.args = make([]strings.Builder, len(j.toolCalls))
	if j.stream {
		rp.stream = newStream(w, true)
		if j.chat {
			rp.object = "chat.completion.chunk"
		}
	}
	rp.finish = j.finish
	res, err := s.generate(r.Context(), j.job, rp.emit)
	aborted := errors.Is(err, errSleepAbort)
	if err != nil && !aborted {
		s.log.Debug("generation ended early", "id", rp.id, "emitted", res.emitted, "err", err)
		return
	}
	if aborted {
		// The engine went to sleep: the request ends as vLLM ends an
		// aborted one, with what it had and finish_reason "abort".
		s.log.Info("aborted request", "id", rp.id, "emitted", res.emitted)
		rp.finish, j.finish = "abort", "abort"
	}
	if rp.stream == nil {
		emittedArgs := make([]string, len(rp.args))
		for k := range rp.args {
			emittedArgs[k] = rp.args[k].String()
		}
		s.writeOpenAIWhole(w, j, rp.id, rp.created, rp.fingerprint, rp.text.String(), emittedArgs, res.emitted)
		return
	}
	rp.endStream(res.emitted, aborted)
}

// chunk wraps one choice in a streamed chunk, with usage when every chunk
// carries it.
func (rp *oaiReply) chunk(c oaiChunkChoice, emitted int) oaiChunk {
	if rp.vllm {
		c.StopReason = jsonNull
	}
	ch := oaiChunk{ID: rp.id, Object: rp.object, Created: rp.created, Model: rp.j.model,
		SystemFingerprint: rp.fingerprint, Choices: []oaiChunkChoice{c}}
	if rp.j.usageAlways {
		ch.Usage = usageOf(rp.j.job.promptTokens, emitted)
	}
	return ch
}

// emit records token i and, when streaming, sends its chunk (after the
// role chunk first, for a vLLM chat).
func (rp *oaiReply) emit(i int) error {
	j, vllm := rp.j, rp.vllm
	last := i == j.job.tokens-1
	var tok string
	if j.toolCalls != nil {
		tok = j.toolCallToks[i]
		rp.args[j.toolCallOf[i]].WriteString(tok)
	} else if j.textToks != nil {
		tok = j.textToks[i]
	} else {
		tok = replyToken(i)
	}
	if rp.garbled {
		tok = garble(tok)
	}
	rp.text.WriteString(tok)
	if rp.stream == nil {
		return nil
	}
	var fr *string
	if last && vllm {
		fr = &rp.finish
	}
	if !j.chat {
		return rp.stream.send(rp.chunk(oaiChunkChoice{Text: &tok, FinishReason: fr}, i+1))
	}
	if i == 0 && vllm {
		empty := ""
		if err := rp.stream.send(rp.chunk(oaiChunkChoice{Delta: &oaiDelta{Role: "assistant", Content: &empty}}, 0)); err != nil {
			return err
		}
	}
	d := &oaiDelta{}
	if !vllm {
		d.Role = "assistant"
	}
	if j.toolCalls != nil {
		// As vLLM streams parallel calls: each call's first chunk has
		// its index, id, type and name; later chunks only arguments.
		k := j.toolCallOf[i]
		tc := oaiToolCallDelta{Index: k, Function: oaiFunctionDelta{Arguments: tok}}
		if i == 0 || j.toolCallOf[i-1] != k {
			tc.ID, tc.Type, tc.Function.Name = toolCallIDN(rp.id, k), "function", j.toolCalls[k].Name
		}
		d.ToolCalls = []oaiToolCallDelta{tc}
	} else {
		d.Content = &tok
	}
	return rp.stream.send(rp.chunk(oaiChunkChoice{Delta: d, FinishReason: fr}, i+1))
}

// endStream sends what follows the token chunks: the finish chunk where
// needed, the usage chunk when asked for, then the end of the stream.
func (rp *oaiReply) endStream(emitted int, aborted bool) {
	j, vllm, stream := rp.j, rp.vllm, rp.stream
	// A final chunk carries finish_reason when no token chunk did: always for
	// Ollama, and for vLLM when nothing was generated or it was aborted.
	if !vllm || emitted == 0 || aborted {
		empty := ""
		if vllm && j.chat && emitted == 0 { // the role chunk goes with the first token
			if err := stream.send(rp.chunk(oaiChunkChoice{Delta: &oaiDelta{Role: "assistant", Content: &empty}}, 0)); err != nil {
				return
			}
		}
		c := oaiChunkChoice{FinishReason: &rp.finish}
		if j.chat {
			c.Delta = &oaiDelta{Content: &empty}
			if !vllm {
				c.Delta.Role = "assistant"
			}
		} else {
			c.Text = &empty
		}
		if err := stream.send(rp.chunk(c, emitted)); err != nil {
			return
		}
	}
	if j.usageFinal {
		u := oaiChunk{ID: rp.id, Object: rp.object, Created: rp.created, Model: j.model,
			SystemFingerprint: rp.fingerprint, Choices: []oaiChunkChoice{}, Usage: usageOf(j.job.promptTokens, emitted)}
		if err := stream.send(u); err != nil {
			return
		}
	}
	_ = stream.done()
}

func toolCallID(requestID string) string {
	return "chatcmpl-tool-" + strings.TrimPrefix(requestID, "chatcmpl-")
}

// toolCallIDN is the id of call k of a reply; the first keeps toolCallID.
func toolCallIDN(requestID string, k int) string {
	if k == 0 {
		return toolCallID(requestID)
	}
	return fmt.Sprintf("%s-%d", toolCallID(requestID), k)
}

// writeOpenAIWhole writes a non-streamed completion or chat completion;
// args are the emitted arguments of each tool call.
func (s *server) writeOpenAIWhole(w http.ResponseWriter, j *openAIJob, id string, created int64, fingerprint, text string, args []string, emitted int) {
	vllm := s.opts.Flavor == FlavorVLLM
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": j.finish}
	if vllm {
		choice["stop_reason"] = nil
	}
	if j.chat {
		msg := map[string]any{"role": "assistant", "content": text}
		if vllm {
			msg["tool_calls"] = []any{}
			msg["reasoning_content"] = nil
		}
		if j.toolCalls != nil {
			msg["content"] = nil
			calls := make([]any, 0, len(j.toolCalls))
			for k, c := range j.toolCalls {
				if k > 0 && args[k] == "" {
					break // cut off by max_tokens before this call began
				}
				calls = append(calls, map[string]any{
					"id":   toolCallIDN(id, k),
					"type": "function",
					"function": map[string]any{
						"name":      c.Name,
						"arguments": args[k],
					},
				})
			}
			msg["tool_calls"] = calls
		}
		choice["message"] = msg
	} else {
		choice["text"] = text
	}
	resp := map[string]any{
		"id":      id,
		"object":  pickS(j.chat, "chat.completion", "text_completion"),
		"created": created,
		"model":   j.model,
		"choices": []any{choice},
		"usage":   usageOf(j.job.promptTokens, emitted),
	}
	if fingerprint != "" {
		resp["system_fingerprint"] = fingerprint
	}
	writeJSON(w, http.StatusOK, resp)
}

// handleOpenAIModels lists the models as GET /v1/models does.
func (s *server) handleOpenAIModels(w http.ResponseWriter, _ *http.Request) {
	var data []any
	if s.opts.Flavor == FlavorVLLM {
		for _, name := range append([]string{s.opts.ServedName}, s.opts.ServedNameAliases...) {
			data = append(data, s.vllmModelCard(name))
		}
	} else {
		for _, m := range s.opts.Models {
			data = append(data, map[string]any{"id": m, "object": "model", "created": s.created, "owned_by": "library"})
		}
	}
	if data == nil {
		data = []any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// vllmModelCard is vLLM's ModelCard for one served name.
func (s *server) vllmModelCard(name string) map[string]any {
	return map[string]any{
		"id":            name,
		"object":        "model",
		"created":       s.created,
		"owned_by":      "vllm",
		"root":          s.opts.Model,
		"parent":        nil,
		"max_model_len": s.opts.MaxModelLen,
		"permission": []any{map[string]any{
			"id":                   fmt.Sprintf("modelperm-%032x", s.created),
			"object":               "model_permission",
			"created":              s.created,
			"allow_create_engine":  false,
			"allow_sampling":       true,
			"allow_logprobs":       true,
			"allow_search_indices": false,
			"allow_view":           true,
			"allow_fine_tuning":    false,
			"organization":         "*",
			"group":                nil,
			"is_blocking":          false,
		}},
	}
}
