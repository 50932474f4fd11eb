package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestClientAsk covers Client.Ask against a stub daemon: the request it
// sends, the stream it hands over, and each way it fails.
func TestClientAsk(t *testing.T) {
	const stream = "event: start\ndata: {\"seq\":1,\"kind\":\"start\"}\n\nevent: stop\ndata: {\"seq\":2,\"kind\":\"stop\",\"reason\":\"answer\"}\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch string(body) {
		case `{"question":"ok"}`:
			if r.Method != http.MethodPost || r.URL.Path != "/api/ask" ||
				r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Accept") != "text/event-stream" ||
				r.Header.Get("Authorization") != "Bearer tok" {
				http.Error(w, fmt.Sprintf("unexpected request %s %s %v", r.Method, r.URL.Path, r.Header), http.StatusTeapot)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, stream)
		case `{"question":"busy"}`:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":"too many questions","detail":"limit is 1"}`)
		case `{"question":"plain"}`:
			http.Error(w, "upstream broke", http.StatusBadGateway)
		case `{"question":"html"}`:
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html></html>")
		case `{"question":"slow"}`:
			<-r.Context().Done() // no headers before the client gives up
		case `{"question":"hold"}`:
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			http.Error(w, "unknown question "+string(body), http.StatusTeapot)
		}
	}))
	defer srv.Close()
	c := NewClient(srv.URL, "tok")
	ctx := context.Background()

	t.Run("stream", func(t *testing.T) {
		var got string
		err := c.Ask(ctx, "ok", func(r io.Reader) error {
			b, err := io.ReadAll(r)
			got = string(b)
			return err
		})
		if err != nil || got != stream {
			t.Fatalf("err %v, stream %q", err, got)
		}
	})
	t.Run("refused", func(t *testing.T) {
		err := c.Ask(ctx, "busy", func(io.Reader) error { t.Error("read called on a refusal"); return nil })
		var re *RemoteError
		if !errors.As(err, &re) || re.Status != http.StatusTooManyRequests || re.Error() != "too many questions (HTTP 429): limit is 1" {
			t.Fatalf("err %v, want the 429 as a *RemoteError", err)
		}
	})
	t.Run("not JSON", func(t *testing.T) {
		err := c.Ask(ctx, "plain", func(io.Reader) error { return nil })
		var re *RemoteError
		if !errors.As(err, &re) || re.Error() != "Bad Gateway (HTTP 502): upstream broke" {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("not a stream", func(t *testing.T) {
		err := c.Ask(ctx, "html", func(io.Reader) error { return nil })
		want := fmt.Sprintf("ask at %s: the answer is %q, not an event stream", srv.URL, "text/html")
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("err %v, want %q…", err, want)
		}
	})
	t.Run("read fails", func(t *testing.T) {
		boom := errors.New("boom")
		err := c.Ask(ctx, "ok", func(io.Reader) error { return boom })
		if !errors.Is(err, boom) || err.Error() != "ask at "+srv.URL+": boom" {
			t.Fatalf("err %v", err)
		}
	})
	// Giving up is said as such whether the deadline comes while the
	// answer streams or before its headers.
	for _, q := range []string{"hold", "slow"} {
		t.Run("gave up/"+q, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			err := c.Ask(ctx, q, func(r io.Reader) error { _, err := io.ReadAll(r); return err })
			if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "ask at "+srv.URL+": gave up waiting: ") {
				t.Fatalf("err %v", err)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		gone := httptest.NewServer(http.NotFoundHandler())
		url := gone.URL
		gone.Close()
		err := NewClient(url, "").Ask(ctx, "ok", func(io.Reader) error { return nil })
		if err == nil || !strings.HasPrefix(err.Error(), "reach gpuhost at "+url+": ") {
			t.Fatalf("err %v", err)
		}
	})
}
