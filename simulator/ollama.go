package simulator

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// ollamaHandler routes Ollama's native API and its OpenAI-compatible layer.
func (s *server) ollamaHandler() http.Handler {
	mux := http.NewServeMux()
	root := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("Ollama is running"))
	}
	mux.HandleFunc("GET /{$}", root) // also answers HEAD, as the ollama CLI probes
	mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": s.opts.Version})
	})
	mux.HandleFunc("GET /api/tags", s.handleOllamaTags)
	mux.HandleFunc("GET /api/ps", s.handleOllamaPs)
	mux.HandleFunc("POST /api/show", s.handleOllamaShow)
	mux.HandleFunc("POST /api/generate", s.handleOllamaGenerate)
	mux.HandleFunc("POST /api/chat", s.handleOllamaChat)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChatCompletions)
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("GET /v1/models", s.handleOpenAIModels)
	mux.HandleFunc("POST /v1/audio/transcriptions", s.handleTranscription)
	mux.HandleFunc("GET /v1/models/{model...}", s.handleOllamaOpenAIModel)
	return mux
}

type ollamaOptions struct {
	NumPredict *int `json:"num_predict"`
	NumCtx     *int `json:"num_ctx"`
}

type ollamaMessage struct {
	Role      string          `json:"role"`
	Content   string          `json:"content"`
	Images    []string        `json:"images"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// ollamaRequest is the union of /api/generate and /api/chat bodies.
type ollamaRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	System    string          `json:"system"`
	Raw       bool            `json:"raw"`
	Context   []int           `json:"context"`
	Images    []string        `json:"images"`
	Messages  []ollamaMessage `json:"messages"`
	Tools     json.RawMessage `json:"tools"`
	Stream    *bool           `json:"stream"`
	KeepAlive json.RawMessage `json:"keep_alive"`
	Options   *ollamaOptions  `json:"options"`
}

// decodeOllamaRequest parses a generate or chat body and its keep_alive
// (default def).
func decodeOllamaRequest(data []byte, def time.Duration) (*ollamaRequest, time.Duration, *apiError) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, 0, badRequest("missing request body")
	}
	var req ollamaRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, 0, badRequest("%v", err)
	}
	if strings.TrimSpace(req.Model) == "" {
		return nil, 0, badRequest("model is required")
	}
	ka, err := parseKeepAlive(req.KeepAlive, def)
	if err != nil {
		return nil, 0, badRequest("%v", err)
	}
	return &req, ka, nil
}

// parseKeepAlive reads Ollama's keep_alive: a number of seconds or a Go
// duration string; negative means forever.
func parseKeepAlive(raw json.RawMessage, def time.Duration) (time.Duration, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return def, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, fmt.Errorf("keep_alive: %w", err)
	}
	switch t := v.(type) {
	case float64:
		if t < 0 {
			return -1, nil
		}
		if t*float64(time.Second) >= math.MaxInt64 {
			return -1, nil
		}
		return time.Duration(t * float64(time.Second)), nil
	case string:
		d, err := time.ParseDuration(t)
		if err != nil {
			return 0, fmt.Errorf("keep_alive: %w", err)
		}
		if d < 0 {
			return -1, nil
		}
		return d, nil
	}
	return 0, fmt.Errorf("keep_alive: unsupported type %T", v)
}

func (s *server) findTag(model string) (string, *apiError) {
	t := normalizeTag(model)
	for _, m := range s.opts.Models {
		if m == t {
			return t, nil
		}
	}
	return "", notFound("model '%s' not found", model)
}

func nowStamp() string { return time.Now().UTC().Format(time.RFC3339Nano) }

func (s *server) handleOllamaGenerate(w http.ResponseWriter, r *http.Request) {
	s.handleOllama(w, r, false)
}

func (s *server) handleOllamaChat(w http.ResponseWriter, r *http.Request) {
	s.handleOllama(w, r, true)
}

// handleOllama serves /api/generate and /api/chat: load/unload requests
// (nothing to generate), then paced generation streamed as NDJSON unless
// "stream": false.
func (s *server) handleOllama(w http.ResponseWriter, r *http.Request, chat bool) {
	body, e := readBody(w, r)
	if e != nil {
		writeOllamaError(w, e)
		return
	}
	req, keepAlive, e := decodeOllamaRequest(body, s.opts.KeepAlive)
	if e != nil {
		writeOllamaError(w, e)
		return
	}
	tag, e := s.findTag(req.Model)
	if e != nil {
		writeOllamaError(w, e)
		return
	}
	empty := (chat && len(req.Messages) == 0) || (!chat && req.Prompt == "" && len(req.Images) == 0)
	if empty {
		s.ollamaLoadUnload(w, r, req, chat, tag, keepAlive)
		return
	}
	prompt := s.ollamaPrompt(req, chat)
	toks := tokenize(prompt)
	promptTokens, limit := s.ollamaBudget(req, len(toks)+len(req.Context))
	tokens, finish := planTokens(s.opts.NaturalTokens, limit, 0, false)
	job := genJob{tag: tag, keepAlive: keepAlive, promptTokens: promptTokens, tokens: tokens, finish: finish}
	streaming := req.Stream == nil || *req.Stream
	var stream *streamWriter
	if streaming {
		stream = newStream(w, false)
	}
	var text strings.Builder
	res, err := s.generate(r.Context(), job, func(i int) error {
		tok := replyToken(i)
		text.WriteString(tok)
		if stream == nil {
			return nil
		}
		out := map[string]any{"model": req.Model, "created_at": nowStamp(), "done": false}
		if chat {
			out["message"] = map[string]any{"role": "assistant", "content": tok}
		} else {
			out["response"] = tok
		}
		return stream.send(out)
	})
	if err != nil {
		s.log.Debug("generation ended early", "model", req.Model, "emitted", res.emitted, "err", err)
		return
	}
	out := s.ollamaFinal(req, chat, stream == nil, text.String(), toks, res, finish, promptTokens)
	if stream == nil {
		writeJSON(w, http.StatusOK, out)
		return
	}
	_ = stream.send(out)
}

// ollamaBase is the start of a final /api/generate or /api/chat reply: the
// model, the time and an empty message or response.
func ollamaBase(req *ollamaRequest, chat bool) map[string]any {
	m := map[string]any{"model": req.Model, "created_at": nowStamp()}
	if chat {
		m["message"] = map[string]any{"role": "assistant", "content": ""}
	} else {
		m["response"] = ""
	}
	return m
}

// ollamaLoadUnload answers a request with nothing to generate: keep_alive 0
// unloads the model, anything else loads it.
func (s *server) ollamaLoadUnload(w http.ResponseWriter, r *http.Request, req *ollamaRequest, chat bool, tag string, keepAlive time.Duration) {
	out := ollamaBase(req, chat)
	out["done"] = true
	if keepAlive == 0 {
		if err := s.models.unload(r.Context(), tag); err != nil {
			return
		}
		out["done_reason"] = "unload"
	} else {
		if _, err := s.models.load(r.Context(), tag, keepAlive); err != nil {
			return
		}
		out["done_reason"] = "load"
	}
	writeJSON(w, http.StatusOK, out)
}

// ollamaBudget truncates the prompt length to num_ctx and returns it with
// the token cap from num_predict (-1: none; -2: fill the context).
func (s *server) ollamaBudget(req *ollamaRequest, promptTokens int) (prompt, limit int) {
	numCtx := s.opts.MaxModelLen
	if req.Options != nil && req.Options.NumCtx != nil && *req.Options.NumCtx > 0 {
		numCtx = *req.Options.NumCtx
	}
	if promptTokens > numCtx {
		s.log.Warn("truncating input prompt", "limit", numCtx, "prompt", promptTokens)
		promptTokens = numCtx
	}
	limit = -1
	if req.Options != nil && req.Options.NumPredict != nil {
		switch n := *req.Options.NumPredict; {
		case n == -2:
			limit = max(numCtx-promptTokens, 0)
		case n >= 0:
			limit = n
		}
	}
	return promptTokens, limit
}

// ollamaFinal is the last reply object: the whole text when not streamed,
// the context (generate), and the counts and durations.
func (s *server) ollamaFinal(req *ollamaRequest, chat, whole bool, text string, toks []string, res genResult, finish string, promptTokens int) map[string]any {
	out := ollamaBase(req, chat)
	if whole {
		if chat {
			out["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			out["response"] = text
		}
	}
	if !chat {
		ctxIDs := append(append([]int{}, req.Context...), tokenIDs(toks)...)
		for i := 0; i < res.emitted; i++ {
			ctxIDs = append(ctxIDs, tokenID(replyToken(i)))
		}
		out["context"] = ctxIDs
	}
	evalDur := res.decode
	if res.emitted > 0 {
		// The first token's decode step ends the prefill wait; count it here
		// so eval_count/eval_duration reads as the decode rate.
		evalDur += time.Duration(float64(time.Second) / s.opts.DecodeTPS)
	}
	out["done"] = true
	out["done_reason"] = finish
	out["total_duration"] = res.total.Nanoseconds()
	out["load_duration"] = res.load.Nanoseconds()
	out["prompt_eval_count"] = promptTokens
	out["prompt_eval_duration"] = res.prefill.Nanoseconds()
	out["eval_count"] = res.emitted
	out["eval_duration"] = evalDur.Nanoseconds()
	return out
}

// ollamaPrompt renders the prompt the model sees: the chat template over
// the messages (and tools), or over system+prompt for /api/generate unless
// raw.
func (s *server) ollamaPrompt(req *ollamaRequest, chat bool) string {
	if !chat {
		if req.Raw {
			return req.Prompt
		}
		var msgs []chatMessage
		if req.System != "" {
			msgs = append(msgs, chatMessage{Role: "system", Content: req.System})
		}
		msgs = append(msgs, chatMessage{Role: "user", Content: req.Prompt + strings.Repeat("<|vision_pad|>", len(req.Images))})
		return renderChat(msgs, nil, true)
	}
	msgs := make([]chatMessage, 0, len(req.Messages))
	for _, m := range req.Messages {
		cm := chatMessage{Role: m.Role, Content: m.Content + strings.Repeat("<|vision_pad|>", len(m.Images))}
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			var buf bytes.Buffer
			if json.Compact(&buf, m.ToolCalls) == nil {
				cm.ToolCalls = buf.String()
			}
		}
		msgs = append(msgs, cm)
	}
	var tools json.RawMessage
	if len(req.Tools) > 0 {
		var buf bytes.Buffer
		if json.Compact(&buf, req.Tools) == nil {
			tools = buf.Bytes()
		}
	}
	addGen := len(req.Messages) == 0 || req.Messages[len(req.Messages)-1].Role != "assistant"
	return renderChat(msgs, tools, addGen)
}

// modelFacts are the made-up but stable facts /api/tags, /api/ps and
// /api/show report for a tag.
type modelFacts struct {
	digest        string
	family        string
	parameterSize string
	sizeVRAM      int64
	sizeDisk      int64
}

var paramSizeRe = regexp.MustCompile(`(?i)^(\d+(?:\.\d+)?)([bm])`)

func (s *server) facts(tag string) modelFacts {
	sum := sha256.Sum256([]byte(tag))
	name, variant, _ := strings.Cut(tag[strings.LastIndexByte(tag, '/')+1:], ":")
	family := name
	if i := strings.IndexAny(family, "-_."); i > 0 {
		family = family[:i]
	}
	ps := "8.0B"
	if m := paramSizeRe.FindStringSubmatch(variant); m != nil {
		ps = m[1] + strings.ToUpper(m[2])
	}
	vram := int64(s.opts.VRAMMiB) << 20
	return modelFacts{digest: hex.EncodeToString(sum[:]), family: family, parameterSize: ps,
		sizeVRAM: vram, sizeDisk: vram * 3 / 4}
}

func (f modelFacts) details() map[string]any {
	return map[string]any{
		"parent_model":       "",
		"format":             "gguf",
		"family":             f.family,
		"families":           []string{f.family},
		"parameter_size":     f.parameterSize,
		"quantization_level": "Q4_K_M",
	}
}

func (s *server) handleOllamaTags(w http.ResponseWriter, _ *http.Request) {
	models := []any{}
	modified := time.Unix(s.created, 0).UTC().Format(time.RFC3339Nano)
	for _, tag := range s.opts.Models {
		f := s.facts(tag)
		models = append(models, map[string]any{
			"name": tag, "model": tag, "modified_at": modified,
			"size": f.sizeDisk, "digest": f.digest, "details": f.details(),
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

func (s *server) handleOllamaPs(w http.ResponseWriter, _ *http.Request) {
	models := []any{}
	if res, ok := s.models.snapshot(); ok {
		f := s.facts(res.tag)
		models = append(models, map[string]any{
			"name": res.tag, "model": res.tag, "size": f.sizeVRAM, "digest": f.digest,
			"details": f.details(), "expires_at": res.expiresAt.Format(time.RFC3339Nano),
			"size_vram": f.sizeVRAM, "context_length": s.opts.MaxModelLen,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

func (s *server) handleOllamaShow(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e != nil {
		writeOllamaError(w, e)
		return
	}
	var req struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	if e := decodeJSON(body, &req); e != nil {
		writeOllamaError(w, e)
		return
	}
	if req.Model == "" {
		req.Model = req.Name
	}
	if req.Model == "" {
		writeOllamaError(w, badRequest("model is required"))
		return
	}
	tag, e := s.findTag(req.Model)
	if e != nil {
		writeOllamaError(w, e)
		return
	}
	f := s.facts(tag)
	writeJSON(w, http.StatusOK, map[string]any{
		"modelfile":  "# Modelfile generated by \"ollama show\"\nFROM " + tag + "\n",
		"parameters": "",
		"template":   "{{ .Prompt }}",
		"details":    f.details(),
		"model_info": map[string]any{
			"general.architecture":           f.family,
			f.family + ".context_length":     40960,
			"general.parameter_count":        f.sizeVRAM / 2,
			"general.quantization_version":   2,
			"tokenizer.ggml.model":           "gpt2",
			"simulator.num_ctx_default":      s.opts.MaxModelLen,
			"simulator.load_time_seconds":    s.opts.LoadTime.Seconds(),
			"simulator.decode_tokens_second": s.opts.DecodeTPS,
		},
		"capabilities": []string{"completion", "tools"},
		"modified_at":  time.Unix(s.created, 0).UTC().Format(time.RFC3339Nano),
	})
}

// handleOllamaOpenAIModel serves GET /v1/models/{model}.
func (s *server) handleOllamaOpenAIModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	tag, e := s.findTag(name)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": tag, "object": "model", "created": s.created, "owned_by": "library"})
}
