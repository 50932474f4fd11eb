package simulator

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"gpuhost/internal/sse"
)

// maxBodyBytes bounds a request body; agent requests with large tool lists
// and long histories stay far below it.
const maxBodyBytes = 32 << 20

// apiError is a request failure with its HTTP status; errType, when set,
// replaces the OpenAI error type derived from the status.
type apiError struct {
	status  int
	message string
	errType string
}

func (e *apiError) Error() string { return e.message }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *apiError {
	return &apiError{status: http.StatusNotFound, message: fmt.Sprintf(format, args...)}
}

// openAIErrorType names the error the way each server does: vLLM uses Python
// exception-like names, Ollama's /v1 layer OpenAI's snake_case types.
func openAIErrorType(f Flavor, status int) string {
	if f == FlavorVLLM {
		switch status {
		case http.StatusBadRequest:
			return "BadRequestError"
		case http.StatusNotFound:
			return "NotFoundError"
		default:
			return "InternalServerError"
		}
	}
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusNotFound:
		return "not_found_error"
	default:
		return "api_error"
	}
}

// writeOpenAIError writes the OpenAI error shape {"error":{message,type,param,code}};
// vLLM puts the HTTP status in code, Ollama leaves it null.
func writeOpenAIError(w http.ResponseWriter, f Flavor, e *apiError) {
	var code any
	if f == FlavorVLLM {
		code = e.status
	}
	typ := e.errType
	if typ == "" {
		typ = openAIErrorType(f, e.status)
	}
	writeJSON(w, e.status, map[string]any{"error": map[string]any{
		"message": e.message,
		"type":    typ,
		"param":   nil,
		"code":    code,
	}})
}

// writeOllamaError writes Ollama's native error shape {"error": "…"}.
func writeOllamaError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, map[string]string{"error": e.message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only our own response types get here; a failure is a bug, not input.
		http.Error(w, "internal error encoding response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// readBody reads a bounded request body.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge,
				message: fmt.Sprintf("request body larger than %d bytes", tooBig.Limit)}
		}
		return nil, badRequest("reading request body: %v", err)
	}
	return data, nil
}

// streamWriter sends Server-Sent Events (OpenAI streams, framed by
// internal/sse) or NDJSON lines (Ollama streams), flushing each one so
// clients see tokens as they come.
type streamWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	events  *sse.Writer // nil: NDJSON
	started bool
}

func newStream(w http.ResponseWriter, isSSE bool) *streamWriter {
	s := &streamWriter{w: w, rc: http.NewResponseController(w)}
	if isSSE {
		s.events = sse.NewWriter(w)
	}
	return s
}

// start sends the header of an NDJSON stream (an SSE stream's is the
// sse.Writer's).
func (s *streamWriter) start() {
	if s.started {
		return
	}
	s.started = true
	s.w.Header().Set("Content-Type", "application/x-ndjson")
	s.w.WriteHeader(http.StatusOK)
}

// send writes one event and flushes it; an error means the client is gone.
func (s *streamWriter) send(v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode stream event: %w", err)
	}
	if s.events != nil {
		if err := s.events.Send(sse.Event{Data: body}); err != nil {
			return fmt.Errorf("write stream event: %w", err)
		}
		return nil
	}
	s.start()
	if _, err := s.w.Write(append(body, '\n')); err != nil {
		return fmt.Errorf("write stream event: %w", err)
	}
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("flush stream event: %w", err)
	}
	return nil
}

// doneData is OpenAI's stream terminator, "data: [DONE]".
var doneData = []byte("[DONE]")

// done ends an SSE stream with OpenAI's terminator.
func (s *streamWriter) done() error {
	if s.events == nil {
		return nil
	}
	if err := s.events.Send(sse.Event{Data: doneData}); err != nil {
		return fmt.Errorf("write stream end: %w", err)
	}
	return nil
}

// randomID returns prefix followed by 32 hex digits, like vLLM's random_uuid.
func randomID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// statusRecorder remembers the status for the access log; Unwrap keeps
// http.ResponseController's Flush working through it.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// accessLog logs each request once it is done, like uvicorn's and gin's
// access logs, so `journalctl -u` of a simulated unit reads like the real one.
func accessLog(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		log.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status,
			"duration", time.Since(start).Round(time.Microsecond), "remote", r.RemoteAddr)
	})
}

// sendEvent writes one SSE event with an "event:" type (the Anthropic and
// Responses streams name every event) and flushes it.
func (s *streamWriter) sendEvent(typ string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode stream event: %w", err)
	}
	if err := s.events.Send(sse.Event{Type: typ, Data: body}); err != nil {
		return fmt.Errorf("write stream event: %w", err)
	}
	return nil
}
