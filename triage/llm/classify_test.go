package llm

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"gpuhost/simulator"
)

func newTestClassifier(t *testing.T, o ClassifierOptions) *Classifier {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quietLogger()
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	c, err := NewClassifier(o)
	if err != nil {
		t.Fatalf("NewClassifier: %v", err)
	}
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var contactTypes = []string{"customer", "prospect", "lead", "promotional", "other"}

func TestClassify(t *testing.T) {
	vllm := startSim(t, simulator.Options{})
	ollama := startSim(t, simulator.Options{Flavor: simulator.FlavorOllama, Model: "qwen3:8b"})
	tests := []struct {
		name      string
		base      string
		model     string
		in        Input
		wantModel string
		check     func(c Classification) bool
	}{
		{"neutral mail, model from /models", vllm, "", Input{From: "bob@example.org", To: []string{"info@shop.example"}, Subject: "Lunch", Body: "See you at noon?"},
			"qwen3-coder", func(c Classification) bool { return c.Importance >= 1 && c.Importance <= 10 }},
		{"promotional keyword", vllm, "qwen3-coder", Input{From: "news@vendor.example", Subject: "Spring deals", Body: "Great prices!\n\nTo unsubscribe click here."},
			"qwen3-coder", func(c Classification) bool {
				return c.ContactType == "promotional" && !c.IsRealConversation && c.Importance <= 2
			}},
		{"german promotional keyword", vllm, "", Input{Subject: "Neuigkeiten", Body: "Hier abmelden."},
			"qwen3-coder", func(c Classification) bool { return c.ContactType == "promotional" }},
		{"invoice is a customer", vllm, "", Input{From: "anna@mueller.example", Subject: "Invoice 4711", Body: "Please find the invoice attached."},
			"qwen3-coder", func(c Classification) bool {
				return c.ContactType == "customer" && c.IsRealConversation && c.Importance >= 7
			}},
		{"transcript carries the request", vllm, "", Input{Subject: "Voice message", Transcript: "Please send us a quote for forty units."},
			"qwen3-coder", func(c Classification) bool { return c.ContactType == "lead" && c.IsRealConversation }},
		{"ollama /v1", ollama, "", Input{Subject: "Rechnung", Body: "Anbei die Rechnung."},
			"qwen3:8b", func(c Classification) bool { return c.ContactType == "customer" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClassifier(t, ClassifierOptions{BaseURL: tt.base, Model: tt.model})
			got, usages, err := c.Classify(ctxT(t), tt.in)
			if err != nil {
				t.Fatalf("Classify: %v", err)
			}
			if !slices.Contains(contactTypes, got.ContactType) || got.Importance < 1 || got.Importance > 10 || !tt.check(got) {
				t.Errorf("verdict %+v", got)
			}
			if !strings.Contains(got.Reasoning, "Simulator verdict") {
				t.Errorf("reasoning %q is not the simulator's labelled verdict", got.Reasoning)
			}
			if len(usages) != 1 {
				t.Fatalf("usages %+v, want one", usages)
			}
			u := usages[0]
			if u.Kind != "classification" || u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.Duration <= 0 || !strings.HasPrefix(u.Model, strings.Split(tt.wantModel, ":")[0]) {
				t.Errorf("usage %+v", u)
			}
			if c.Model() != tt.wantModel {
				t.Errorf("model %q, want %q", c.Model(), tt.wantModel)
			}
		})
	}
}

func TestClassifyFaults(t *testing.T) {
	mail := Input{From: "anna@mueller.example", Subject: "Order 17", Body: "Where is my order?"}
	t.Run("prose twice is unclassified", func(t *testing.T) {
		rec := &recorder{}
		base := startSim(t, simulator.Options{SchemaFault: simulator.SchemaFaultProse})
		c := newTestClassifier(t, ClassifierOptions{BaseURL: base, Model: "qwen3-coder", HTTPClient: &http.Client{Transport: rec}})
		_, usages, err := c.Classify(ctxT(t), mail)
		var ue *UnclassifiedError
		if !errors.As(err, &ue) || !IsUnclassified(err) {
			t.Fatalf("err %v, want *UnclassifiedError", err)
		}
		if !strings.Contains(ue.Reason, "not a JSON object") || !strings.Contains(ue.Raw, "--schema-fault") || len(ue.Raw) > maxRawBytes {
			t.Errorf("unclassified %+v", ue)
		}
		if len(usages) != 2 || usages[1].CompletionTokens == 0 {
			t.Errorf("usages %+v, want two attempts", usages)
		}
		// The retry told the model what was wrong, after its own reply.
		_, bodies := rec.requests()
		if len(bodies) != 2 {
			t.Fatalf("%d requests, want 2", len(bodies))
		}
		var second struct {
			Messages []struct{ Role, Content string }
			Format   json.RawMessage `json:"response_format"`
		}
		if err := json.Unmarshal(bodies[1], &second); err != nil {
			t.Fatal(err)
		}
		n := len(second.Messages)
		if n != 4 || second.Messages[2].Role != "assistant" || !strings.Contains(second.Messages[2].Content, "--schema-fault") ||
			!strings.Contains(second.Messages[3].Content, "not a JSON object") {
			t.Errorf("retry messages %+v", second.Messages)
		}
		if !strings.Contains(string(second.Format), `"strict":true`) || !strings.Contains(string(second.Format), `"maximum":10`) {
			t.Errorf("response_format %s", second.Format)
		}
	})
	t.Run("prose once then valid", func(t *testing.T) {
		base := startSim(t, simulator.Options{SchemaFault: simulator.SchemaFaultProseOnce})
		c := newTestClassifier(t, ClassifierOptions{BaseURL: base})
		got, usages, err := c.Classify(ctxT(t), mail)
		if err != nil {
			t.Fatalf("Classify: %v", err)
		}
		if len(usages) != 2 || got.ContactType != "customer" {
			t.Errorf("verdict %+v usages %+v, want a customer after two attempts", got, usages)
		}
		// The next mail succeeds at once.
		if _, usages, err := c.Classify(ctxT(t), mail); err != nil || len(usages) != 1 {
			t.Errorf("second mail: %d usages, err %v", len(usages), err)
		}
	})
	t.Run("schema violation is caught in code", func(t *testing.T) {
		base := startSim(t, simulator.Options{SchemaFault: simulator.SchemaFaultInvalid})
		c := newTestClassifier(t, ClassifierOptions{BaseURL: base})
		_, usages, err := c.Classify(ctxT(t), mail)
		var ue *UnclassifiedError
		if !errors.As(err, &ue) {
			t.Fatalf("err %v, want *UnclassifiedError", err)
		}
		if !strings.Contains(ue.Reason, "/importance") || !strings.Contains(ue.Reason, "maximum") || !strings.Contains(ue.Raw, `"importance":42`) {
			t.Errorf("unclassified %+v", ue)
		}
		if len(usages) != 2 {
			t.Errorf("usages %+v", usages)
		}
	})
	t.Run("endpoint down is a transport error", func(t *testing.T) {
		for _, model := range []string{"", "qwen3-coder"} {
			c := newTestClassifier(t, ClassifierOptions{BaseURL: deadURL(t), Model: model, APIKey: "sk-secret-value"})
			_, usages, err := c.Classify(ctxT(t), mail)
			if err == nil || IsUnclassified(err) || len(usages) != 0 {
				t.Fatalf("model %q: err %v usages %v, want a transport error", model, err, usages)
			}
			if strings.Contains(err.Error(), "sk-secret-value") {
				t.Errorf("error leaks the API key: %v", err)
			}
		}
	})
	t.Run("cancelled context", func(t *testing.T) {
		base := startSim(t, simulator.Options{})
		c := newTestClassifier(t, ClassifierOptions{BaseURL: base, Model: "qwen3-coder"})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, _, err := c.Classify(ctx, mail); !errors.Is(err, context.Canceled) || IsUnclassified(err) {
			t.Errorf("err %v, want context.Canceled", err)
		}
	})
	t.Run("unknown model is an API error", func(t *testing.T) {
		base := startSim(t, simulator.Options{})
		c := newTestClassifier(t, ClassifierOptions{BaseURL: base, Model: "nope"})
		_, _, err := c.Classify(ctxT(t), mail)
		if err == nil || IsUnclassified(err) || !strings.Contains(err.Error(), "404") {
			t.Errorf("err %v, want the server's 404", err)
		}
	})
}

func TestNewClassifierOptions(t *testing.T) {
	for _, tt := range []struct {
		o    ClassifierOptions
		want string
	}{
		{ClassifierOptions{}, "base URL is required"},
		{ClassifierOptions{BaseURL: "ftp://x/v1"}, "http://"},
		{ClassifierOptions{BaseURL: "http://user:pw@/v1"}, "xxxxx"},
		{ClassifierOptions{BaseURL: "http://h/v1", Timeout: -time.Second}, "negative timeout"},
		{ClassifierOptions{BaseURL: "http://[::1/v1"}, "not a URL"},
	} {
		_, err := NewClassifier(tt.o)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), ":pw@") {
			t.Errorf("%+v: err %v, want it to say %q", tt.o, err, tt.want)
		}
	}
	if _, err := NewTranscriber(TranscriberOptions{BaseURL: "http://h/v1", MaxBytes: -1}); err == nil {
		t.Error("negative MaxBytes accepted")
	}
}

func TestRenderInput(t *testing.T) {
	long := strings.Repeat("ä", maxBodyChars+500)
	many := make([]string, 30)
	for i := range many {
		many[i] = "x@example.org"
	}
	tests := []struct {
		name    string
		in      Input
		has     []string
		hasNot  []string
		maxSize int
	}{
		{"clipped body", Input{Body: long}, []string{"[Body clipped: showing the first 12000 of 12500 characters.]"}, nil, 2*maxBodyChars + 500},
		{"short body", Input{Body: "hi"}, []string{"\nhi\n"}, []string{"clipped"}, 200},
		{"no body", Input{}, []string{"(no text body)"}, nil, 200},
		{"header injection", Input{Subject: "a\r\nFrom: boss@corp"}, []string{"Subject: a From: boss@corp\n"}, []string{"\nFrom: boss"}, 300},
		{"many recipients", Input{To: many}, []string{"(and 10 more)"}, nil, 1000},
		{"transcript", Input{Transcript: strings.Repeat("w", maxTranscriptChars+1)}, []string{"Voice memo transcript:", "[Transcript clipped"}, nil, 3 * maxTranscriptChars},
	}
	for _, tt := range tests {
		out := renderInput(tt.in)
		for _, h := range tt.has {
			if !strings.Contains(out, h) {
				t.Errorf("%s: output lacks %q", tt.name, h)
			}
		}
		for _, h := range tt.hasNot {
			if strings.Contains(out, h) {
				t.Errorf("%s: output has %q", tt.name, h)
			}
		}
		if len(out) > tt.maxSize {
			t.Errorf("%s: %d bytes, want at most %d", tt.name, len(out), tt.maxSize)
		}
	}
}

// TestClassifierCapsWithMaxTokens: the reply cap travels as max_tokens, the
// field Ollama's OpenAI API reads (it ignores max_completion_tokens, so the
// cap would silently vanish behind an Ollama profile). go-openai marks
// MaxTokens deprecated; this keeps it from being "fixed" away.
func TestClassifierCapsWithMaxTokens(t *testing.T) {
	bodies := make(chan map[string]any, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.URL.Path == "/v1/chat/completions" && json.NewDecoder(r.Body).Decode(&body) == nil {
			select {
			case bodies <- body:
			default:
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"message":"recorded","type":"test"}}`))
	}))
	t.Cleanup(srv.Close)
	c := newTestClassifier(t, ClassifierOptions{BaseURL: srv.URL + "/v1", Model: "qwen3:8b"})
	if _, _, err := c.Classify(ctxT(t), Input{From: "a@b.example", Subject: "s", Body: "b"}); err == nil {
		t.Fatal("Classify succeeded against a server that only answers 503")
	}
	var body map[string]any
	select {
	case body = <-bodies:
	default:
		t.Fatal("no chat completion request reached the server")
	}
	if got, ok := body["max_tokens"].(float64); !ok || got != maxReplyTokens {
		t.Errorf("max_tokens = %v, want %d", body["max_tokens"], maxReplyTokens)
	}
	if v, ok := body["max_completion_tokens"]; ok {
		t.Errorf("max_completion_tokens = %v sent; Ollama ignores it", v)
	}
}
