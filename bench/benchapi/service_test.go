package benchapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/bench"
	"gpuhost/internal/testkit"
	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
	"gpuhost/units"
)

type serviceFixture struct {
	svc       *Service
	url       string
	store     *bench.Store
	switching atomic.Bool
	idle      atomic.Bool
	mu        sync.Mutex
	published []string
}

func newServiceFixture(t *testing.T, decodeTPS float64) *serviceFixture {
	t.Helper()
	simURL := simtest.Start(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct",
		ServedName: "qwen3-coder", PrefillTPS: 1e6, DecodeTPS: decodeTPS})
	u, _ := url.Parse(simURL)
	port, _ := strconv.Atoi(u.Port())
	p := &units.Profile{Name: "coder", Backend: units.VLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct",
		ServedName: "qwen3-coder", Port: port}
	f := &serviceFixture{store: bench.NewStore(t.TempDir(), slog.New(slog.DiscardHandler))}
	f.svc = NewService(ServiceOptions{
		Store: f.store,
		Daemon: DaemonFuncs{
			SwitchingFunc: f.switching.Load,
			AwaitActiveFunc: func(ctx context.Context) (*units.Profile, error) {
				if f.idle.Load() {
					return nil, errors.New("no backend is active")
				}
				return p, nil
			},
		},
		GpuhostVersion: "v-test",
		Publish: func(msg string) {
			f.mu.Lock()
			f.published = append(f.published, msg)
			f.mu.Unlock()
		},
		Log: slog.New(slog.DiscardHandler),
		// Negative: every progress line is published, so the test does not
		// depend on how fast a phase runs (1 ms dropped a fast prefill's line).
		MinPublishInterval: -1,
	})
	e := echo.New()
	f.svc.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); f.svc.Close() })
	f.url = srv.URL
	return f
}

func (f *serviceFixture) do(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

const quickRun = `{"repeats": 1, "prefill_tokens": [64], "decode_tokens": [16], "concurrency": [2], "serving_requests": 2}`

func TestServiceRun(t *testing.T) {
	f := newServiceFixture(t, 2000)
	code, body := f.do(t, "POST", "/api/bench", quickRun)
	if code != http.StatusAccepted {
		t.Fatalf("POST = %d %s", code, body)
	}
	var st bench.RunStatus
	if err := json.Unmarshal(body, &st); err != nil || st.Status != "running" || st.Profile != "coder" || !strings.HasSuffix(st.ID, "-coder") {
		t.Fatalf("status %+v %v", st, err)
	}
	// One at a time.
	if code, body := f.do(t, "POST", "/api/bench", ""); code != http.StatusConflict || !strings.Contains(string(body), "bench in progress") {
		t.Errorf("second POST = %d %s", code, body)
	}
	var r bench.Result
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body = f.do(t, "GET", "/api/bench/"+st.ID, "")
		if code == http.StatusOK {
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			break
		}
		if code != http.StatusAccepted || time.Now().After(deadline) {
			t.Fatalf("GET = %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.Status != bench.StatusOK || r.ID != st.ID || r.Fingerprint.Profile != "coder" || r.Fingerprint.GpuhostVersion != "v-test" ||
		len(r.Prefill) != 1 || len(r.Decode) != 1 || len(r.Serving) != 1 {
		t.Fatalf("result %s: %+v", r.Status, r)
	}
	f.mu.Lock()
	pub := strings.Join(f.published, "\n")
	f.mu.Unlock()
	for _, want := range []string{"started on profile coder", "prefill 64 tokens", "serving c=2", "finished, ok"} {
		if !strings.Contains(pub, want) {
			t.Errorf("published messages lack %q:\n%s", want, pub)
		}
	}
	// A corrupt file shows as a warning in the list, never an error.
	if err := os.WriteFile(filepath.Join(f.store.Dir, "20260101T000000Z-bad.json"), []byte("{oops"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, body = f.do(t, "GET", "/api/bench", "")
	var list bench.ListResponse
	if err := json.Unmarshal(body, &list); code != 200 || err != nil || len(list.Results) != 1 || len(list.Warnings) != 1 ||
		list.Running == nil || list.Running.Status != bench.StatusOK || list.Results[0].DecodeTokS[16] <= 0 {
		t.Fatalf("list = %d %s", code, body)
	}
	if code, body := f.do(t, "GET", "/api/bench/latest", ""); code != 200 || !strings.Contains(string(body), st.ID) {
		t.Errorf("latest = %d %s", code, body)
	}
	code, body = f.do(t, "GET", "/api/bench/chart.svg", "")
	if code != 200 || !strings.HasPrefix(string(body), "<svg") || !strings.Contains(string(body), "coder") {
		t.Errorf("chart = %d %.200s", code, body)
	}
}

func TestServiceRefuses(t *testing.T) {
	f := newServiceFixture(t, 2000)
	f.switching.Store(true)
	if code, body := f.do(t, "POST", "/api/bench", ""); code != http.StatusConflict || !strings.Contains(string(body), "switch in progress") {
		t.Errorf("during a switch: %d %s", code, body)
	}
	f.switching.Store(false)
	f.idle.Store(true)
	if code, body := f.do(t, "POST", "/api/bench", ""); code != http.StatusConflict || !strings.Contains(string(body), "no active backend") {
		t.Errorf("idle: %d %s", code, body)
	}
	f.idle.Store(false)
	for _, body := range []string{`{"repeats": "x"}`, `{"nope": 1}`, `[1]`, `{"repeats": 1000}`, `{"phases": ["warp"]}`} {
		if code, resp := f.do(t, "POST", "/api/bench", body); code != http.StatusBadRequest || !strings.Contains(string(resp), `"error"`) {
			t.Errorf("%s: %d %s", body, code, resp)
		}
	}
	for _, id := range []string{"nope", "20260101T000000Z-missing", "..%2F..%2Fetc"} {
		if code, body := f.do(t, "GET", "/api/bench/"+id, ""); code != http.StatusNotFound {
			t.Errorf("GET %s = %d %s", id, code, body)
		}
	}
	if code, body := f.do(t, "GET", "/api/bench", ""); code != 200 || !strings.Contains(string(body), `"results":[]`) {
		t.Errorf("empty list = %d %s", code, body)
	}
}

// TestServiceClose: shutting the daemon down stops a run and still stores
// what it measured, saying why it stopped.
func TestServiceClose(t *testing.T) {
	f := newServiceFixture(t, 100)
	st, err := f.svc.Start(context.Background(), bench.StartRequest{Repeats: 3, PrefillTokens: []int{64}, DecodeTokens: []int{2000}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for f.svc.Current().Progress.Phase != bench.PhaseDecode {
		if time.Now().After(deadline) {
			t.Fatal("never reached decode")
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.svc.Close()
	r, err := f.store.Load(st.ID)
	if err != nil {
		t.Fatal(err)
	}
	cur := f.svc.Current()
	if r.Status != bench.StatusPartial || r.Prefill[0].TokS.N != 3 || cur.Status != bench.StatusPartial || !strings.Contains(cur.Error, "context canceled") {
		t.Fatalf("status %s, current %+v, errors %+v", r.Status, cur, r.Errors)
	}
}

// TestServiceFailedRunNotStored: a daemon run that measures nothing is
// reported (status, error) but stored only with keep_failed.
func TestServiceFailedRunNotStored(t *testing.T) {
	store := bench.NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	p := &units.Profile{Name: "coder", Backend: units.VLLM, Model: "m", Port: 1}
	dead := "http://" + testkit.FreeAddr(t)
	svc := NewService(ServiceOptions{Store: store, Log: slog.New(slog.DiscardHandler),
		Daemon: DaemonFuncs{SwitchingFunc: func() bool { return false },
			AwaitActiveFunc: func(context.Context) (*units.Profile, error) { return p, nil }},
		Target: func(*units.Profile) bench.Target { return bench.Target{URL: dead, Model: "m"} }})
	e := echo.New()
	svc.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); svc.Close() })
	f := &serviceFixture{svc: svc, url: srv.URL, store: store}
	for i, c := range []struct {
		body   string
		stored int
	}{{quickRun, 0}, {`{"repeats": 1, "keep_failed": true}`, 1}} {
		code, body := f.do(t, "POST", "/api/bench", c.body)
		var st bench.RunStatus
		if code != http.StatusAccepted || json.Unmarshal(body, &st) != nil {
			t.Fatalf("POST = %d %s", code, body)
		}
		deadline := time.Now().Add(30 * time.Second)
		for svc.Current().Status == "running" {
			if time.Now().After(deadline) {
				t.Fatal("run did not end")
			}
			time.Sleep(10 * time.Millisecond)
		}
		cur := svc.Current()
		all, _, _ := store.List()
		if cur.Status != bench.StatusFailed || !strings.Contains(cur.Error, "connection refused") || len(all) != c.stored {
			t.Fatalf("run %d: current %+v, %d stored (want %d)", i, cur, len(all), c.stored)
		}
		code, body = f.do(t, "GET", "/api/bench/"+cur.ID, "")
		switch {
		case c.stored == 0 && (code != http.StatusNotFound || cur.Result != "" || !strings.Contains(string(body), "not stored")):
			t.Errorf("unstored failed run: result %q, GET = %d %s", cur.Result, code, body)
		case c.stored == 1 && (code != http.StatusOK || cur.Result == ""):
			t.Errorf("kept failed run: result %q, GET = %d %s", cur.Result, code, body)
		}
	}
}

// TestServiceUpload: POST /api/bench/results stores a finished result
// (listed and served like the daemon's own), and refuses what is not one.
func TestServiceUpload(t *testing.T) {
	f := newServiceFixture(t, 2000)
	data, err := os.ReadFile("../testdata/result-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	code, body := f.do(t, "POST", "/api/bench/results", string(data))
	var up bench.UploadResponse
	if code != http.StatusCreated || json.Unmarshal(body, &up) != nil || up.Result != "/api/bench/"+up.ID {
		t.Fatalf("upload = %d %s", code, body)
	}
	if code, _ := f.do(t, "GET", up.Result, ""); code != http.StatusOK {
		t.Errorf("GET %s = %d", up.Result, code)
	}
	for _, bad := range []string{`{not json`, `{"id": "x"}`, `{"schema_version": 1, "id": "../../etc/passwd"}`} {
		if code, body := f.do(t, "POST", "/api/bench/results", bad); code != http.StatusBadRequest {
			t.Errorf("upload %s = %d %s, want 400", bad, code, body)
		}
	}
	if all, _, _ := f.store.List(); len(all) != 1 {
		t.Errorf("%d stored, want 1", len(all))
	}
	if len(f.published) != 1 || !strings.Contains(f.published[0], ": uploaded, ") {
		t.Errorf("published %q", f.published)
	}
}
