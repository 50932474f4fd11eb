// Package simtest runs the project's inference simulator in the test's own
// process on an ephemeral loopback port: the one way the backend, bench and
// triage tests get a real vLLM- or Ollama-shaped HTTP server without
// building the gpuhost binary. It stops when the test ends.
package simtest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"gpuhost/simulator"
)

// Start runs the simulator with o (its Addr and Ready are set here; a nil
// Logger discards) and returns its base URL, "http://127.0.0.1:PORT".
func Start(t testing.TB, o simulator.Options) string {
	t.Helper()
	o.Addr = "127.0.0.1:0"
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ready := make(chan string, 1)
	o.Ready = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- simulator.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("simulator: %v", err)
		}
	})
	select {
	case addr := <-ready:
		return "http://" + addr
	case err := <-done:
		t.Fatalf("simulator did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("simulator did not start within 60s")
	}
	return ""
}
