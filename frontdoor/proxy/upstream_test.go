package proxy_test

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/sse"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// These tests put a recording HTTP server where the backend would be, to
// see exactly what the proxy sends and how it handles a backend that breaks.
// The Supervisor is replaced by a fixed "active" state (appliancetest.Fixed):
// what matters here is the wire, which the simulator cannot show.

type recorded struct {
	header http.Header
	body   string
	path   string
}

// wireEnv serves the proxy in front of handler, as profile "p" (vLLM,
// served name "served", alias "alias").
func wireEnv(t *testing.T, handler http.HandlerFunc) (string, *observer, *[]recorded, *sync.Mutex) {
	t.Helper()
	var mu sync.Mutex
	var got []recorded
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, recorded{header: r.Header.Clone(), body: string(b), path: r.URL.RequestURI()})
		mu.Unlock()
		handler(w, r)
	}))
	t.Cleanup(up.Close)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(up.URL, "http://"))
	n, _ := strconv.Atoi(port)
	prof := &units.Profile{Name: "p", Backend: units.VLLM, Model: "org/model", ServedName: "served", Aliases: []string{"alias"}, Port: n}
	url, obs := serveProxy(t, prof)
	return url, obs, &got, &mu
}

// serveProxy serves a proxy whose only, active, profile is prof.
func serveProxy(t *testing.T, prof *units.Profile) (string, *observer) {
	t.Helper()
	p := proxy.New(appliancetest.Fixed{Profile: prof}, config.ProxyConfig{}, func() map[string]*units.Profile {
		return map[string]*units.Profile{prof.Name: prof}
	}, slog.New(slog.DiscardHandler))
	obs := &observer{}
	p.SetObserver(obs)
	e := echo.New()
	p.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); p.Close() })
	return srv.URL, obs
}

// TestWireBytes: the body goes upstream byte for byte (key order, spacing,
// numbers JSON decoders would change); an alias changes only the model
// value; the client's token and Accept-Encoding stay behind.
func TestWireBytes(t *testing.T) {
	url, _, got, mu := wireEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	})
	odd := "{ \"z\": 1e400, \"big\": 123456789012345678901234567890, \"model\" : \"served\",\n\"a\": 1.0, \"s\": \"\\u00e9\\/\" }"
	tests := []struct{ name, body, want string }{
		{"served name: untouched", odd, odd},
		{"alias: only the value changes", strings.Replace(odd, `"served"`, `"alias"`, 1), odd},
		{"model id: mapped to the served name", strings.Replace(odd, `"served"`, `"org/model"`, 1), odd},
		{"no model: inserted first", `{"prompt":"hi"}`, `{"model":"served","prompt":"hi"}`},
	}
	for i, tc := range tests {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions?x=1", strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer gpuhost-token")
		req.Header.Set("Accept-Encoding", "gzip")
		req.Header.Set("X-Client", "kept")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		r := (*got)[i]
		mu.Unlock()
		if r.body != tc.want {
			t.Errorf("%s: upstream got %q, want %q", tc.name, r.body, tc.want)
		}
		if r.path != "/v1/completions?x=1" || r.header.Get("Authorization") != "" || r.header.Get("Accept-Encoding") != "" ||
			r.header.Get("X-Client") != "kept" || r.header.Get("Content-Length") != "" && r.header.Get("Content-Length") != strconv.Itoa(len(tc.want)) {
			t.Errorf("%s: upstream request %s headers %v", tc.name, r.path, r.header)
		}
	}
}

// TestBackendFailures: a backend that refuses connections gives 502 after a
// few quick retries; one that breaks off mid-stream ends the client's
// stream with an error event (never a clean end that would look like a
// complete answer: TestStreamWithoutEndMarker) and is recorded as 502.
func TestBackendFailures(t *testing.T) {
	port := testkit.FreePort(t) // nothing listens here
	url, obs := serveProxy(t, &units.Profile{Name: "p", Backend: units.VLLM, Model: "m", Port: port})
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("refused backend: %d, want 502", resp.StatusCode)
	}
	if ae := decodeError(t, resp); ae.Error.Code != "backend_unreachable" {
		t.Fatalf("refused backend: %+v", ae.Error)
	}
	if o := obs.waitFor(t, 1)[0]; o.status != 502 {
		t.Fatalf("observation %+v", o)
	}

	url, obs, _, _ = wireEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_ = sse.NewWriter(w).Send(sse.Event{Data: []byte(`{"choices":[{"delta":{"content":"a"}}]}`)})
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // the backend dies mid-stream
		}
	})
	resp, err = client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"served","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readEvents(resp, nil)
	if err != nil || len(evs) != 2 || !strings.Contains(evs[1].Data, `"stream_incomplete"`) {
		t.Fatalf("a stream the backend broke off: events %v, end %v; want the chunk and the error event", evs, err)
	}
	if o := obs.waitFor(t, 1)[0]; o.status != 502 || o.model != "served" {
		t.Fatalf("observation %+v, want 502", o)
	}
}
