package llm

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	openai "github.com/sashabaranov/go-openai"
)

// PromptVersion names the prompt and schema pair (classify.v1.prompt.md,
// classify.v1.schema.json). The worker stores it with each verdict, so a
// result can be traced to the instructions that produced it and a changed
// prompt gets a new version instead of silently changing old meanings.
const PromptVersion = "classify.v1"

//go:embed classify.v1.prompt.md
var classifyPrompt string

const (
	// schemaName is response_format.json_schema.name (OpenAI allows
	// letters, digits, _ and -).
	schemaName = "classify_v1"
	// maxBodyChars bounds the mail body shown to the model: enough for any
	// real conversation, and long newsletters or quoted threads do not
	// crowd out the context or cost minutes of prefill.
	maxBodyChars = 12000
	// maxTranscriptChars bounds a voice memo transcript (about 20 minutes
	// of speech).
	maxTranscriptChars = 8000
	// maxSubjectChars and maxRecipients bound the header lines.
	maxSubjectChars = 500
	maxRecipients   = 20
	// maxReplyTokens caps one reply; the JSON needs about 100 tokens.
	maxReplyTokens = 1024
	// maxRawBytes bounds UnclassifiedError.Raw.
	maxRawBytes = 500
	// maxEchoChars bounds the rejected reply repeated to the model on retry.
	maxEchoChars = 2000
	// replyTemperature is low: triage should not change its mind between
	// runs, and vLLM's default (the model's generation config) is higher.
	replyTemperature = 0.2
	// defaultClassifyTimeout is per attempt (prefill of a long mail on a
	// busy box included).
	defaultClassifyTimeout = 120 * time.Second
)

// ClassifierOptions configures a Classifier.
type ClassifierOptions struct {
	// BaseURL is the OpenAI-compatible endpoint including /v1 (the daemon's
	// managed /v1, or vLLM directly).
	BaseURL string
	// Model is the model name; empty means the first id of GET /models,
	// which on a single-model box is the active model (asked once, cached).
	Model string
	// APIKey is sent as a bearer token when set; it never appears in
	// errors or logs.
	APIKey string
	// HTTPClient defaults to a plain client; deadlines come from Timeout.
	HTTPClient *http.Client
	// Timeout bounds each model call (default 120s).
	Timeout time.Duration
	// Logger receives a warning for each rejected reply; default
	// slog.Default().
	Logger *slog.Logger
}

// Classifier asks an OpenAI-compatible model for a strict-schema verdict on
// a mail and checks the verdict in code, because "deterministic beats
// model": a reply that is not exactly the schema never reaches the rules.
type Classifier struct {
	client  *openai.Client
	shown   string // base URL for messages, password redacted
	timeout time.Duration
	log     *slog.Logger
	schema  *jsonschema.Schema

	mu    sync.Mutex
	model string // configured, or learnt from /models
}

// UnclassifiedError means the model answered, twice, with something that
// is not a valid verdict. The worker posts the mail as "unclassified" with
// Reason instead of retrying: asking again would cost the same and likely
// fail the same way. Transport failures are other errors.
type UnclassifiedError struct {
	// Reason says what was wrong with the last reply.
	Reason string
	// Raw is the start of the last reply (at most 500 bytes).
	Raw string
}

func (e *UnclassifiedError) Error() string {
	return "mail not classified: " + e.Reason
}

// NewClassifier checks the options and prepares the schema; it makes no
// call to the endpoint.
func NewClassifier(o ClassifierOptions) (*Classifier, error) {
	client, shown, err := newClient("classifier", o.BaseURL, o.APIKey, o.HTTPClient)
	if err != nil {
		return nil, err
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("classifier: negative timeout %s", o.Timeout)
	}
	if o.Timeout == 0 {
		o.Timeout = defaultClassifyTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	schema, err := compileClassifySchema()
	if err != nil {
		return nil, fmt.Errorf("classifier: %w", err)
	}
	return &Classifier{
		client: client, shown: shown, timeout: o.Timeout, schema: schema,
		model: strings.TrimSpace(o.Model),
		log:   o.Logger.With("stage", "classify", "endpoint", shown, "prompt", PromptVersion),
	}, nil
}

// Model returns the model name in use ("" until it was learnt from
// /models).
func (c *Classifier) Model() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.model
}

// resolveModel returns the configured model or the first one the endpoint
// lists. A failure is not cached, so a later mail tries again.
func (c *Classifier) resolveModel(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.model != "" {
		return c.model, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	list, err := c.client.ListModels(ctx)
	if err != nil {
		return "", fmt.Errorf("classifier: list models at %s: %w", c.shown, err)
	}
	for _, m := range list.Models {
		if id := strings.TrimSpace(m.ID); id != "" {
			c.model = id
			return id, nil
		}
	}
	return "", fmt.Errorf("classifier: %s/models lists no model", c.shown)
}

// Classify asks for a verdict on one mail. A reply that is not valid
// against the schema is answered once with what was wrong; if the second
// reply is not valid either, the error is an *UnclassifiedError. Any other
// error (endpoint down, 5xx, timeout, cancelled context) is a transport
// error to retry later. Usages has one entry per attempt that got an
// answer, also when an error is returned.
func (c *Classifier) Classify(ctx context.Context, in Input) (Classification, []Usage, error) {
	model, err := c.resolveModel(ctx)
	if err != nil {
		return Classification{}, nil, err
	}
	msgs := []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: classifyPrompt},
		{Role: openai.ChatMessageRoleUser, Content: renderInput(in)},
	}
	var usages []Usage
	var reason, raw string
	for attempt := 1; attempt <= 2; attempt++ {
		reply, finish, u, err := c.complete(ctx, model, msgs)
		if err != nil {
			return Classification{}, usages, fmt.Errorf("classifier: attempt %d: %w", attempt, err)
		}
		usages = append(usages, u)
		cl, perr := parseReply(c.schema, reply)
		if perr == nil && finish != openai.FinishReasonLength {
			return cl, usages, nil
		}
		reason = rejectReason(perr, finish)
		raw = reply
		c.log.Warn("classification reply rejected", "attempt", attempt, "model", model, "reason", reason)
		echo, _ := clipRunes(reply, maxEchoChars)
		msgs = append(msgs,
			openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, Content: echo},
			openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: retryMessage(reason)})
	}
	return Classification{}, usages, &UnclassifiedError{Reason: reason, Raw: clipBytes(raw, maxRawBytes)}
}

// rejectReason explains a rejected reply; a reply cut at the token limit
// is named as such even when what arrived happens to parse.
func rejectReason(perr error, finish openai.FinishReason) string {
	if finish == openai.FinishReasonLength {
		if perr != nil {
			return fmt.Sprintf("the reply was cut off at the %d-token limit (%v)", maxReplyTokens, perr)
		}
		return fmt.Sprintf("the reply was cut off at the %d-token limit", maxReplyTokens)
	}
	return perr.Error()
}

// retryMessage tells the model what was wrong. It names no category on
// purpose: the schema in response_format says what is allowed.
func retryMessage(reason string) string {
	return "Your previous reply was rejected: " + reason + ". " +
		"Answer again with only the JSON object required by the response schema: all four fields, no other text, no code fences."
}

// complete makes one chat completion call with the strict schema.
func (c *Classifier) complete(ctx context.Context, model string, msgs []openai.ChatCompletionMessage) (string, openai.FinishReason, Usage, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req := openai.ChatCompletionRequest{
		Model:    model,
		Messages: msgs,
		// max_tokens, not max_completion_tokens: Ollama's OpenAI API
		// (0.17) reads only max_tokens and would leave the reply unbounded.
		//lint:ignore SA1019 Ollama's OpenAI API reads only max_tokens
		MaxTokens:   maxReplyTokens,
		Temperature: replyTemperature,
		ResponseFormat: &openai.ChatCompletionResponseFormat{
			Type: openai.ChatCompletionResponseFormatTypeJSONSchema,
			JSONSchema: &openai.ChatCompletionResponseFormatJSONSchema{
				Name:   schemaName,
				Schema: json.RawMessage(classifySchema),
				Strict: true,
			},
		},
	}
	start := time.Now()
	resp, err := c.client.CreateChatCompletion(ctx, req)
	took := time.Since(start)
	if err != nil {
		return "", "", Usage{}, fmt.Errorf("chat completion at %s with model %q: %w", c.shown, model, err)
	}
	u := Usage{
		Kind: "classification", Model: model, Duration: took,
		PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens,
	}
	if resp.Model != "" {
		u.Model = resp.Model
	}
	if len(resp.Choices) == 0 {
		return "", "", u, nil // parsed as an empty reply: rejected, retried
	}
	return resp.Choices[0].Message.Content, resp.Choices[0].FinishReason, u, nil
}

// renderInput is the user message: the headers that matter, the body
// (clipped, with a note saying so) and a voice memo transcript.
func renderInput(in Input) string {
	var b strings.Builder
	line := func(k, v string) {
		v = strings.Join(strings.Fields(v), " ") // no header injection via newlines
		fmt.Fprintf(&b, "%s: %s\n", k, v)
	}
	line("From", in.From)
	to := in.To
	more := 0
	if len(to) > maxRecipients {
		to, more = to[:maxRecipients], len(to)-maxRecipients
	}
	rcpt := strings.Join(to, ", ")
	if more > 0 {
		rcpt += fmt.Sprintf(" (and %d more)", more)
	}
	line("To", rcpt)
	subject, cut := clipRunes(in.Subject, maxSubjectChars)
	if cut {
		subject += "…"
	}
	line("Subject", subject)
	b.WriteString("\n")
	body := strings.TrimSpace(in.Body)
	if body == "" {
		b.WriteString("(no text body)\n")
	} else {
		shown, cut := clipRunes(body, maxBodyChars)
		b.WriteString(shown)
		b.WriteString("\n")
		if cut {
			fmt.Fprintf(&b, "\n[Body clipped: showing the first %d of %d characters.]\n", maxBodyChars, len([]rune(body)))
		}
	}
	if t := strings.TrimSpace(in.Transcript); t != "" {
		shown, cut := clipRunes(t, maxTranscriptChars)
		b.WriteString("\nVoice memo transcript:\n")
		b.WriteString(shown)
		b.WriteString("\n")
		if cut {
			fmt.Fprintf(&b, "\n[Transcript clipped: showing the first %d of %d characters.]\n", maxTranscriptChars, len([]rune(t)))
		}
	}
	return b.String()
}

// IsUnclassified reports whether err means "the model answered, but not
// with a valid verdict" (post as unclassified) rather than a transport
// failure (retry later).
func IsUnclassified(err error) bool {
	var u *UnclassifiedError
	return errors.As(err, &u)
}
