package proxy

import (
	"bytes"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"gpuhost/internal/apishape"
)

// apiErr is an answer gpuhost gives itself on /v1, written in the OpenAI
// error shape so that OpenAI SDKs (opencode's included) show the message.
type apiErr struct {
	status     int
	typ        string // OpenAI "type": invalid_request_error, service_unavailable, …
	code       string // machine-readable reason: model_not_found, hold_timeout, …
	param      string
	msg        string
	retryAfter bool
	extra      map[string]any
}

// writeError writes e in the shape of the request's API (apishape.Write:
// OpenAI's for chat, Responses and the rest, Anthropic's for Messages),
// with Retry-After when e asks for it.
func writeError(w http.ResponseWriter, e *apiErr, kind apishape.Kind) {
	if e.retryAfter {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	apishape.Write(w, kind, &apishape.Error{Status: e.status, Type: e.typ, Code: e.code, Param: e.param, Message: e.msg, Extra: e.extra})
}

// badJSON is the 400 for a body that is not a JSON object.
func badJSON(err error) *apiErr {
	msg := "request body is not a valid JSON object: " + err.Error()
	code := "invalid_json"
	if errors.Is(err, errModelNotString) {
		msg, code = err.Error(), "invalid_model"
	}
	e := &apiErr{status: http.StatusBadRequest, typ: "invalid_request_error", code: code, msg: msg}
	if code == "invalid_model" {
		e.param = "model"
	}
	return e
}

// isJSONMediaType accepts application/json and +json types.
func isJSONMediaType(ct string) bool {
	mt, ok := mediaType(ct)
	return ok && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// mediaType is the media type of a Content-Type as mime.ParseMediaType
// reads it (false when it does not parse). The values that nearly every
// request and answer carries are recognised without it: it allocates a
// parameter map each time, on the hot path of every /v1 request.
func mediaType(ct string) (string, bool) {
	switch ct {
	case "application/json", "application/json; charset=utf-8", "text/event-stream", "text/event-stream; charset=utf-8":
		mt, _, _ := strings.Cut(ct, ";")
		return mt, true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return mt, err == nil
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

func newBytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
