package main

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	"gpuhost/bench/benchapi"
	"gpuhost/bench/benchtest"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
)

// benchDaemon is a real Supervisor (simulated coder backend active) behind
// the daemon's API with the bench service, as serve wires them; /v1 is a
// plain reverse proxy to the backend, standing in for the daemon's proxy.
func benchDaemon(t *testing.T) (*httptest.Server, *bench.Store, *appliancetest.Fixture) {
	t.Helper()
	return benchDaemonWith(t, nil)
}

// benchDaemonWith is benchDaemon with prep applied to the fixture before
// the API is built (e.g. a listen address beyond loopback).
func benchDaemonWith(t *testing.T, prep func(*appliancetest.Fixture)) (*httptest.Server, *bench.Store, *appliancetest.Fixture) {
	t.Helper()
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	if prep != nil {
		prep(f)
	}
	e, err := httpapi.New(f.Sup, f.Doctor, f.Log)
	if err != nil {
		t.Fatal(err)
	}
	store := bench.NewStore(f.Cfg.StateDir, f.Log)
	svc := benchapi.NewService(benchapi.ServiceOptions{
		Store:   store,
		Daemon:  benchapi.DaemonFuncs{SwitchingFunc: func() bool { return false }, AwaitActiveFunc: f.Sup.AwaitActive},
		Publish: func(msg string) { f.Sup.Publish(api.Event{Kind: "bench", Message: msg}) },
		Log:     f.Log,
	})
	svc.Register(e)
	backend, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(f.Cfg.Profiles["coder"].Port))
	e.Any("/v1/*", echo.WrapHandler(benchtest.Forward(backend)))
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); svc.Close() })
	return srv, store, f
}

var quickBench = []string{"--repeats", "1", "--prefill", "64", "--decode", "16", "--concurrency", "2", "--serving-requests", "2"}

// TestBenchRunThroughDaemon: `gpuhost bench run` against the daemon (found
// by $GPUHOST_URL with no config, or named by --url) stores its result in
// the daemon's store, where GET /api/bench (the panel's Bench page) lists
// it, and nothing under the user's state directory; against a plain
// endpoint (the bare backend) it stores locally as before.
func TestBenchRunThroughDaemon(t *testing.T) {
	srv, store, f := benchDaemon(t)
	local := t.TempDir()
	t.Setenv("XDG_STATE_HOME", local)
	t.Setenv("GPUHOST_API_TOKEN", "")
	defaultConfigPath = filepath.Join(t.TempDir(), "none.yaml")
	t.Cleanup(func() { defaultConfigPath = config.DefaultPath })
	savedRE := regexp.MustCompile(`saved (\S+)`)
	for i, tc := range []struct {
		name string
		args []string
	}{
		{"daemon rule", nil},
		{"--url daemon", []string{"--url", srv.URL + "/v1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GPUHOST_URL", srv.URL)
			out, err := runCLI(t, append(append([]string{"bench", "run"}, quickBench...), tc.args...)...)
			if err != nil {
				t.Fatalf("bench run: %v\n%s", err, out)
			}
			m := savedRE.FindStringSubmatch(out)
			if m == nil || !strings.HasPrefix(m[1], srv.URL+"/api/bench/") || !strings.Contains(out, "(the daemon's store)") {
				t.Fatalf("not saved on the daemon:\n%s", out)
			}
			all, _, err := store.List()
			if err != nil || len(all) != i+1 {
				t.Fatalf("the daemon stores %d results (%v), want %d", len(all), err, i+1)
			}
			if id := all[len(all)-1].ID; m[1] != srv.URL+"/api/bench/"+id {
				t.Errorf("printed %s, the daemon stored %s", m[1], id)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(local, "gpuhost", "bench")); err == nil {
		t.Error("a daemon run also stored under the user's state directory")
	}
	// list and show read the daemon's store, found by $GPUHOST_URL as
	// every daemon command finds it: the ids printed as saved are there.
	t.Run("list and show through $GPUHOST_URL", func(t *testing.T) {
		t.Setenv("GPUHOST_URL", srv.URL)
		all, _, _ := store.List()
		out, err := runCLI(t, "bench", "list")
		if err != nil || !strings.Contains(out, all[0].ID) || !strings.Contains(out, all[1].ID) || strings.Contains(out, "local store") {
			t.Errorf("bench list: %v\n%s", err, out)
		}
		out, err = runCLI(t, "bench", "show", all[1].ID)
		if err != nil || !strings.Contains(out, all[1].ID) {
			t.Errorf("bench show %s: %v\n%s", all[1].ID, err, out)
		}
	})
	// The upload route is guarded like every state-changing API route.
	resp, err := http.Post(srv.URL+"/api/bench/results", "text/plain", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 || resp.StatusCode >= 500 {
		t.Errorf("upload without a JSON content type: %d, want refused", resp.StatusCode)
	}
	t.Run("plain endpoint", func(t *testing.T) {
		bare := "http://127.0.0.1:" + strconv.Itoa(f.Cfg.Profiles["coder"].Port)
		out, err := runCLI(t, append(append([]string{"bench", "run"}, quickBench...), "--url", bare)...)
		if err != nil {
			t.Fatalf("bench run --url %s: %v\n%s", bare, err, out)
		}
		if !strings.Contains(out, "saved "+filepath.Join(local, "gpuhost", "bench")) {
			t.Errorf("a plain endpoint's result is not stored locally:\n%s", out)
		}
		if all, _, _ := store.List(); len(all) != 2 {
			t.Errorf("the daemon stores %d results, want still 2", len(all))
		}
	})
}

// TestBenchUploadNeedsTokenBeyondLoopback: on a daemon listening beyond
// loopback the upload route wants the API token like every other route:
// without it or with a wrong one 401 and nothing stored; `gpuhost bench
// run` with $GPUHOST_API_TOKEN uploads, and the token appears in no output.
func TestBenchUploadNeedsTokenBeyondLoopback(t *testing.T) {
	const token = "tok-bench-0123456789abcdef"
	t.Setenv("GPUHOST_API_TOKEN", token)
	srv, store, _ := benchDaemonWith(t, func(f *appliancetest.Fixture) { f.Cfg.Listen = "0.0.0.0:0" })
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	defaultConfigPath = filepath.Join(t.TempDir(), "none.yaml")
	t.Cleanup(func() { defaultConfigPath = config.DefaultPath })
	for _, auth := range []string{"", "Bearer wrong-0123456789abcdefghij"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/bench/results", strings.NewReader(`{"schema_version":1}`))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("upload with Authorization %q: %d, want 401", auth, resp.StatusCode)
		}
	}
	if all, _, _ := store.List(); len(all) != 0 {
		t.Fatalf("an unattributed upload was stored: %d results", len(all))
	}
	t.Setenv("GPUHOST_URL", srv.URL)
	out, err := runCLI(t, append([]string{"bench", "run"}, quickBench...)...)
	if err != nil || !strings.Contains(out, "(the daemon's store)") {
		t.Fatalf("bench run with the token: %v\n%s", err, out)
	}
	if all, _, _ := store.List(); len(all) != 1 {
		t.Errorf("the daemon stores %d results, want 1", len(all))
	}
	if strings.Contains(out, token) {
		t.Error("the token is in the CLI's output")
	}
}
