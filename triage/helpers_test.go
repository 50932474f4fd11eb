package triage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/internal/testkit"
	"gpuhost/triage/llm"
	"gpuhost/triage/sink"
	"gpuhost/triage/source"
)

// newFakeClock is advanced by the test; its After fires at once (moving
// the clock) so that Run's sleeps cost no wall time.
func newFakeClock() *testkit.Clock {
	return testkit.NewClock(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC))
}

// memSource is an in-memory mailbox for the worker's own unit tests (the
// pipeline tests use the real Maildir and Dovecot sources).
type memSource struct {
	mu          sync.Mutex
	uidValidity uint32
	mails       []source.Mail
	fetchErr    error
	fetches     int
}

func (s *memSource) add(raw string) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	uid := uint32(len(s.mails) + 1)
	if n := len(s.mails); n > 0 {
		uid = s.mails[n-1].UID + 1
	}
	s.mails = append(s.mails, source.Mail{UID: uid, Raw: []byte(raw), Size: int64(len(raw))})
	return uid
}

func (s *memSource) Fetch(ctx context.Context, after uint32, limit int, maxBytes int64) (source.Batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetches++
	if s.fetchErr != nil {
		return source.Batch{}, s.fetchErr
	}
	b := source.Batch{UIDValidity: s.uidValidity}
	for _, m := range s.mails {
		b.HighestUID = m.UID
		if m.UID > after && len(b.Mails) < limit {
			b.Mails = append(b.Mails, m)
		}
	}
	return b, nil
}

func (s *memSource) Get(ctx context.Context, uid uint32, maxBytes int64) (source.Mail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.mails {
		if m.UID == uid {
			return m, nil
		}
	}
	return source.Mail{}, source.ErrNotFound
}

func (s *memSource) Wait(ctx context.Context, d time.Duration) error { return ctx.Err() }
func (s *memSource) Name() string                                    { return "mem://test/INBOX" }
func (s *memSource) Close() error                                    { return nil }

// recSink records posts and alerts; failPost makes Post fail.
type recSink struct {
	name      string
	mu        sync.Mutex
	posts     []sink.Post
	alerts    []string
	failPost  error
	failAlert error
}

func (s *recSink) Name() string { return s.name }

func (s *recSink) Post(ctx context.Context, p sink.Post) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPost != nil {
		return s.failPost
	}
	s.posts = append(s.posts, p)
	return nil
}

func (s *recSink) Alert(ctx context.Context, text string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failAlert != nil {
		return s.failAlert
	}
	s.alerts = append(s.alerts, text)
	return nil
}

func (s *recSink) Posts() []sink.Post {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sink.Post(nil), s.posts...)
}

func (s *recSink) Alerts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.alerts...)
}

// fakeClassifier answers from the subject: "[promo]" → promotional, "[err]"
// → a transport error, "[invalid]" → unclassified; otherwise a customer at
// importance 5. It stands in for the model in the worker's unit tests; the
// pipeline tests use the simulator over HTTP.
type fakeClassifier struct {
	mu    sync.Mutex
	calls int
	down  error
}

func (f *fakeClassifier) Classify(ctx context.Context, in llm.Input) (llm.Classification, []llm.Usage, error) {
	f.mu.Lock()
	f.calls++
	down := f.down
	f.mu.Unlock()
	u := []llm.Usage{{Kind: "classification", Model: "fake", PromptTokens: 1000, CompletionTokens: 100, Duration: 2 * time.Second}}
	switch {
	case down != nil:
		return llm.Classification{}, nil, down
	case strings.Contains(in.Subject, "[invalid]"):
		return llm.Classification{}, u, &llm.UnclassifiedError{Reason: "importance 11 is above the maximum 10", Raw: `{"importance":11}`}
	case strings.Contains(in.Subject, "[promo]"):
		return llm.Classification{ContactType: "promotional", Importance: 2, Reasoning: "a newsletter"}, u, nil
	}
	return llm.Classification{IsRealConversation: true, ContactType: "customer", Importance: 5, Reasoning: "asks about an order"}, u, nil
}

// fakeTranscriber fails for file names containing "broken".
type fakeTranscriber struct{}

func (fakeTranscriber) Transcribe(ctx context.Context, filename string, data []byte) (llm.Transcript, llm.Usage, error) {
	if strings.Contains(filename, "broken") {
		return llm.Transcript{}, llm.Usage{}, errors.New("POST /v1/audio/transcriptions: 500 Internal Server Error")
	}
	return llm.Transcript{Filename: filename, Text: "Please call me back about the invoice.", Seconds: 30},
		llm.Usage{Kind: "transcription", Model: "whisper-1", AudioSeconds: 30, Duration: time.Second}, nil
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// eml builds a small RFC 5322 mail.
func eml(from, to, subject, body string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nSubject: %s\r\nMessage-ID: <%d@test>\r\nDate: Mon, 30 Nov 2026 08:00:00 +0000\r\n", from, to, subject, len(subject)+len(body))
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n")
	b.WriteString(body + "\r\n")
	return b.String()
}
