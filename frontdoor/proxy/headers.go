package proxy

import (
	"net/http"
	"strings"
)

// The front door owns what a browser or client does with an answer, not
// the backend: vLLM answers every origin with Access-Control-Allow-Origin
// *, and a backend (or anything listening on its port) could set cookies
// on gpuhost's origin, where the panel's session lives, send a client
// elsewhere with Location, or clear the panel's storage. Such headers are
// dropped from every /v1 answer; hop-by-hop headers are dropped by
// httputil.ReverseProxy already. What a client reads (Content-Type,
// lengths, request ids, rate headers) passes.
var backendOwnedHeaders = []string{
	"Set-Cookie", "Set-Cookie2", "Clear-Site-Data",
	"Location", "Content-Location", "Refresh",
	"Strict-Transport-Security", "Alt-Svc", "Public-Key-Pins",
	"WWW-Authenticate", "Proxy-Authenticate",
	"Content-Security-Policy", "Cross-Origin-Resource-Policy", "Cross-Origin-Opener-Policy",
	"Cross-Origin-Embedder-Policy", "Timing-Allow-Origin", "Link", "Server",
}

// ownResponseHeaders removes from a backend's answer the headers that are
// the front door's to set: CORS (Access-Control-*), cookies, redirects and
// the origin policies listed in backendOwnedHeaders.
func ownResponseHeaders(h http.Header) {
	for _, k := range backendOwnedHeaders {
		h.Del(k)
	}
	for k := range h {
		if strings.HasPrefix(k, "Access-Control-") {
			delete(h, k)
		}
	}
}

// answerOptions answers OPTIONS on /v1 itself (never forwarded: a
// backend's answer is a CORS grant to every origin). gpuhost grants no
// cross-origin access, so the answer lists the methods and nothing else.
func answerOptions(w http.ResponseWriter) {
	w.Header().Set("Allow", "GET, POST, OPTIONS")
	w.WriteHeader(http.StatusNoContent)
}
