package llm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	openai "github.com/sashabaranov/go-openai"
)

const (
	// defaultTranscriptionModel is OpenAI's Whisper name, which most
	// OpenAI-compatible speech servers accept too.
	defaultTranscriptionModel = "whisper-1"
	// defaultMaxAudioBytes is OpenAI's upload limit (25 MiB). It is checked
	// against the file; the server's limit covers the whole form, a few
	// hundred bytes more.
	defaultMaxAudioBytes = 25 << 20
	// defaultTranscribeTimeout covers the upload and a long memo.
	defaultTranscribeTimeout = 300 * time.Second
	// maxFilenameBytes bounds the name sent; the extension is kept.
	maxFilenameBytes = 200
)

// ErrAudioTooLarge is wrapped by Transcribe for a file over MaxBytes; it is
// decided before any request, and retrying will not help.
var ErrAudioTooLarge = errors.New("audio file too large to transcribe")

// TranscriberOptions configures a Transcriber.
type TranscriberOptions struct {
	// BaseURL is the OpenAI-compatible endpoint including /v1.
	BaseURL string
	// Model defaults to whisper-1.
	Model string
	// APIKey is sent as a bearer token when set; never logged.
	APIKey string
	// HTTPClient defaults to a plain client; deadlines come from Timeout.
	HTTPClient *http.Client
	// Timeout bounds one transcription (default 300s).
	Timeout time.Duration
	// MaxBytes is the largest file sent (default 25 MiB, OpenAI's limit).
	MaxBytes int64
}

// Transcriber turns voice memo attachments into text through
// /v1/audio/transcriptions, asking for verbose_json so the audio duration
// (the per-minute price basis) comes back with the text.
type Transcriber struct {
	client   *openai.Client
	shown    string
	model    string
	timeout  time.Duration
	maxBytes int64
}

// NewTranscriber checks the options; it makes no call to the endpoint.
func NewTranscriber(o TranscriberOptions) (*Transcriber, error) {
	client, shown, err := newClient("transcriber", o.BaseURL, o.APIKey, o.HTTPClient)
	if err != nil {
		return nil, err
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("transcriber: negative timeout %s", o.Timeout)
	}
	if o.MaxBytes < 0 {
		return nil, fmt.Errorf("transcriber: negative max bytes %d", o.MaxBytes)
	}
	t := &Transcriber{client: client, shown: shown, model: strings.TrimSpace(o.Model), timeout: o.Timeout, maxBytes: o.MaxBytes}
	if t.model == "" {
		t.model = defaultTranscriptionModel
	}
	if t.timeout == 0 {
		t.timeout = defaultTranscribeTimeout
	}
	if t.maxBytes == 0 {
		t.maxBytes = defaultMaxAudioBytes
	}
	return t, nil
}

// Transcribe sends one audio file. filename is the attachment's name (its
// extension tells the server the format); it is reduced to a safe base name.
// The Usage carries the reported audio seconds and the call's duration.
func (t *Transcriber) Transcribe(ctx context.Context, filename string, data []byte) (Transcript, Usage, error) {
	name := safeFilename(filename)
	if len(data) == 0 {
		return Transcript{}, Usage{}, fmt.Errorf("transcribe %q: the file is empty", name)
	}
	if int64(len(data)) > t.maxBytes {
		return Transcript{}, Usage{}, fmt.Errorf("transcribe %q: %d bytes exceed the limit of %d: %w", name, len(data), t.maxBytes, ErrAudioTooLarge)
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	start := time.Now()
	resp, err := t.client.CreateTranscription(ctx, openai.AudioRequest{
		Model:    t.model,
		FilePath: name,
		Reader:   bytes.NewReader(data),
		Format:   openai.AudioResponseFormatVerboseJSON,
	})
	took := time.Since(start)
	if err != nil {
		return Transcript{}, Usage{}, fmt.Errorf("transcribe %q (%d bytes) at %s with model %q: %w", name, len(data), t.shown, t.model, err)
	}
	seconds := resp.Duration
	if seconds <= 0 && len(resp.Segments) > 0 {
		seconds = resp.Segments[len(resp.Segments)-1].End
	}
	tr := Transcript{Filename: name, Text: strings.TrimSpace(resp.Text), Seconds: seconds}
	u := Usage{Kind: "transcription", Model: t.model, AudioSeconds: seconds, Duration: took}
	return tr, u, nil
}

// safeFilename keeps the base name of an attachment name from a mail
// (outside input), without control characters, so it cannot break the
// multipart header; an empty result becomes "audio".
func safeFilename(name string) string {
	name = strings.ReplaceAll(name, "\\", "/")
	name = filepath.Base(strings.TrimSpace(name))
	name = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '"' || r == '/' {
			return -1
		}
		return r
	}, name)
	name = strings.TrimSpace(name)
	if len(name) > maxFilenameBytes {
		ext := filepath.Ext(name)
		if len(ext) > 16 {
			ext = ""
		}
		name = clipBytes(name[:len(name)-len(ext)], maxFilenameBytes-len(ext)) + ext
	}
	if name == "" || name == "." || name == ".." {
		return "audio"
	}
	return name
}
