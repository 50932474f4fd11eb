package simulator

import (
	"net/http"
	"os"
	"strings"
	"sync/atomic"
)

// crashExit ends the process as a crashing backend would: no shutdown, no
// release of the simulated VRAM claim (the claim's process is gone, so the
// simulated GPU drops it, as the driver frees a dead process's memory).
var crashExit = func() { os.Exit(3) }

// crashAtStart exits while o.CrashFile exists (--crash-file).
func crashAtStart(o Options) {
	if o.CrashFile == "" {
		return
	}
	if _, err := os.Stat(o.CrashFile); err != nil {
		return
	}
	o.Logger.Error("simulated crash at start: the crash file exists", "crash_file", o.CrashFile)
	crashExit()
}

// inferencePaths are the requests --crash-after-requests counts.
var inferencePaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/api/chat", "/api/generate"}

// crashAfter wraps h so that the process exits right after answering
// o.CrashAfterRequests inference requests (--crash-after-requests).
func crashAfter(o Options, h http.Handler) http.Handler {
	if o.CrashAfterRequests <= 0 {
		return h
	}
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		for _, p := range inferencePaths {
			if strings.HasPrefix(r.URL.Path, p) {
				if n.Add(1) == int64(o.CrashAfterRequests) {
					if f, ok := w.(http.Flusher); ok {
						f.Flush()
					}
					o.Logger.Error("simulated crash after answering requests", "requests", o.CrashAfterRequests)
					crashExit()
				}
				return
			}
		}
	})
}
