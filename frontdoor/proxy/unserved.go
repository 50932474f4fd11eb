package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"gpuhost/internal/apishape"
	"gpuhost/units"
)

// An API the backend does not serve (an Ollama before 0.14 has no
// /v1/messages, before 0.13.3 no /v1/responses; Ollama 0.17.4 has no
// /v1/messages/count_tokens; an older vLLM has neither) is answered by the
// backend's router with a bare 404 ("404 page not found", FastAPI's
// {"detail":"Not Found"}), which a client shows as a puzzle. gpuhost
// passes every API through untranslated, so such an answer is replaced by
// an error in the client's shape that names the backend, its version and
// the path.

// maxRouterNotFound bounds the body read to recognise a router's 404.
const maxRouterNotFound = 4 << 10

// versionTimeout bounds the backend version lookup for that message.
const versionTimeout = 2 * time.Second

// unservedAPI replaces resp's body and headers with gpuhost's error when
// resp is the backend's "no such route" for one of the agent APIs; it
// reports whether it did.
func (p *Proxy) unservedAPI(resp *http.Response, x *exchange) bool {
	switch x.api {
	case apishape.Messages, apishape.CountTokens, apishape.Responses, apishape.Embeddings:
	default:
		return false
	}
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		return false
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxRouterNotFound+1))
	if err != nil || len(body) > maxRouterNotFound || !routerNotFound(resp.Header.Get("Content-Type"), body) {
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), resp.Body))
		return false
	}
	_ = resp.Body.Close()
	backend := p.backendVersion(resp.Request.Context(), x.prof)
	e := &apiErr{status: http.StatusNotFound, typ: "invalid_request_error", code: "api_not_served",
		msg: fmt.Sprintf("the backend of profile %s (%s) does not serve %s %s; gpuhost passes this API through to the backend and does not translate it: use a backend version that serves it, or another API",
			x.prof.Name, backend, resp.Request.Method, resp.Request.URL.Path),
		extra: map[string]any{"backend": backend}}
	rec := &headerRecorder{h: http.Header{}}
	writeError(rec, e, x.api)
	resp.StatusCode, resp.Status = e.status, strconv.Itoa(e.status)+" "+http.StatusText(e.status)
	resp.Header = rec.h
	resp.Body = io.NopCloser(bytes.NewReader(rec.body.Bytes()))
	resp.ContentLength = int64(rec.body.Len())
	x.status = e.status
	return true
}

// routerNotFound tells a router's "no such path" from an API's own 404
// (an unknown model is a JSON error with an "error" member).
func routerNotFound(contentType string, body []byte) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt != "application/json" {
		return true // Go's and most routers' plain-text 404
	}
	var v struct {
		Detail any `json:"detail"`
		Error  any `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil {
		return false
	}
	d, _ := v.Detail.(string)
	return v.Error == nil && (d == "Not Found" || d == "Method Not Allowed")
}

// backendVersion names the backend and asks it for its version (Ollama's
// /api/version, vLLM's /version), "version unknown" when it does not say.
func (p *Proxy) backendVersion(ctx context.Context, prof *units.Profile) string {
	name, path := string(prof.Backend), "/version"
	if prof.Backend == units.Ollama {
		path = "/api/version"
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), versionTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+backendHost(prof)+path, nil)
	if err != nil {
		return name + ", version unknown"
	}
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		return name + ", version unknown"
	}
	defer resp.Body.Close()
	var v struct {
		Version string `json:"version"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&v) != nil || v.Version == "" {
		return name + ", version unknown"
	}
	return name + " " + strings.TrimPrefix(truncate(v.Version, 64), "v")
}

// headerRecorder collects what writeError writes.
type headerRecorder struct {
	h    http.Header
	body bytes.Buffer
}

func (r *headerRecorder) Header() http.Header         { return r.h }
func (r *headerRecorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *headerRecorder) WriteHeader(int)             {}
