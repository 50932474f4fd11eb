package benchcmd

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	"gpuhost/internal/testkit"
)

// TestBenchSwitchSavedIDIsShown is a defect that was: `bench switch`
// printed "saved <id>" and `bench show <id>` answered "no such bench
// result" (rc 2), because switch wrote the local folder and show read
// another. Now both go to the daemon named by --url: the printed id is
// shown, listed and compared, and the local folder stays empty.
func TestBenchSwitchSavedIDIsShown(t *testing.T) {
	f, url := switchDaemon(t, appliancetest.Options{Activate: "coder"})
	state := t.TempDir()
	deps := switchDeps(state)
	out, errOut, err := runCmd(t, deps, "switch", "coder", "llama", "--rounds", "1", "--url", url)
	if err != nil {
		t.Fatalf("bench switch: %v\n%s\n%s", err, out, errOut)
	}
	m := regexp.MustCompile(`saved (\S+)/api/bench/(\S+) \(the daemon's store\)`).FindStringSubmatch(out)
	if m == nil || m[1] != url {
		t.Fatalf("not saved in the daemon's store:\n%s", out)
	}
	id := m[2]
	for _, args := range [][]string{{"show", id}, {"show", "latest"}, {"list"}, {"compare", id, id}} {
		out, errOut, err := runCmd(t, deps, append(args, "--url", url)...)
		if err != nil || !strings.Contains(out, id) && args[0] != "compare" {
			t.Errorf("%v: %v\n%s\n%s", args, err, out, errOut)
		}
		if strings.Contains(errOut, "local store") {
			t.Errorf("%v read the local store although the daemon answers: %s", args, errOut)
		}
	}
	if r, err := bench.NewStore(f.Cfg.StateDir, nil).Load(id); err != nil || r.Kind() != bench.KindSwitch {
		t.Errorf("the daemon's store: %v", err)
	}
	if all, _, _ := bench.NewStore(state, nil).List(); len(all) != 0 {
		t.Errorf("%d results in the local folder, want 0", len(all))
	}
	// --dir still stores in that folder, and reads it.
	dir := t.TempDir()
	out, _, err = runCmd(t, deps, "switch", "coder", "llama", "--rounds", "1", "--url", url, "--dir", dir)
	if err != nil || !strings.Contains(out, "saved "+dir) {
		t.Fatalf("bench switch --dir: %v\n%s", err, out)
	}
	out, errOut, err = runCmd(t, deps, "list", "--dir", dir, "--url", url)
	if err != nil || strings.Count(out, "switch vllm↔ollama") != 1 || errOut != "" {
		t.Errorf("list --dir: %v\n%s\n%s", err, out, errOut)
	}
}

// TestBenchReadFallsBack: list, show and compare read the local folder
// only when no daemon answers, and say so on stderr (stdout stays the
// answer); a daemon that answers but refuses is an error naming it, not a
// silent switch to another store.
func TestBenchReadFallsBack(t *testing.T) {
	state := t.TempDir()
	r := &bench.Result{SchemaVersion: bench.SchemaVersion, ID: bench.NewID(time.Now(), "local"), Status: bench.StatusOK, StartedAt: time.Now()}
	if _, err := bench.NewStore(state, nil).Save(r); err != nil {
		t.Fatal(err)
	}
	deps := switchDeps(state)
	down := "http://" + testkit.FreeAddr(t)
	out, errOut, err := runCmd(t, deps, "list", "--url", down)
	if err != nil || !strings.Contains(out, r.ID) || !strings.Contains(errOut, "no daemon answers at "+down+"; reading the local store "+state) {
		t.Errorf("list, no daemon: %v\n%s\n%s", err, out, errOut)
	}
	out, errOut, err = runCmd(t, deps, "show", r.ID, "--url", down)
	if err != nil || !strings.Contains(out, r.ID) || !strings.Contains(errOut, "reading the local store") {
		t.Errorf("show, no daemon: %v\n%s\n%s", err, out, errOut)
	}
	// An empty local store with the daemon down: stdout itself says that
	// the daemon's results are not in this answer.
	empty := switchDeps(t.TempDir())
	out, _, err = runCmd(t, empty, "list", "--url", down)
	if err != nil || !strings.Contains(out, "no results in ") || !strings.Contains(out, "the daemon at "+down+" was not reached") {
		t.Errorf("list, empty local store, no daemon: %v\n%s", err, out)
	}
	// No daemon client at all (a build without one): local, said.
	_, errOut, err = runCmd(t, Deps{Env: deps.Env}, "list")
	if err != nil || !strings.Contains(errOut, "no daemon configured; reading the local store "+state) {
		t.Errorf("list, no daemon configured: %v\n%s", err, errOut)
	}
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="gpuhost"`)
		http.Error(w, `{"error":"unauthorized","detail":"a bearer token is required"}`, http.StatusUnauthorized)
	}))
	defer refusing.Close()
	_, _, err = runCmd(t, deps, "list", "--url", refusing.URL)
	if err == nil || exitOf(err) != 1 || !strings.Contains(err.Error(), "the daemon at "+refusing.URL) {
		t.Errorf("list, daemon refuses: %v, want exit 1 naming the daemon", err)
	}
	// An id the daemon does not have is the daemon's "no such bench result".
	_, url := switchDaemon(t, appliancetest.Options{Activate: "coder"})
	_, _, err = runCmd(t, deps, "show", r.ID, "--url", url)
	if err == nil || !strings.Contains(err.Error(), "no such bench result") || !strings.Contains(err.Error(), "the daemon at "+url) {
		t.Errorf("show of a local-only id through the daemon: %v", err)
	}
}

// TestBenchCapacityThroughDaemon: `bench capacity` measuring the daemon's
// /v1 stores its result in the daemon's store, as bench run and bench
// switch do, where `bench show` finds the printed id.
func TestBenchCapacityThroughDaemon(t *testing.T) {
	f, url := switchDaemon(t, appliancetest.Options{Activate: "coder"})
	state := t.TempDir()
	deps := switchDeps(state)
	out, errOut, err := runCmd(t, deps, "capacity", "--url", url+"/v1", "--model", "qwen3-coder", "--ttft-p95", "5s", "--min-tps", "1",
		"--max-concurrency", "2", "--repeats", "2", "--serving-input", "16", "--serving-output", "4")
	if err != nil {
		t.Fatalf("bench capacity: %v\n%s\n%s", err, out, errOut)
	}
	m := regexp.MustCompile(`saved (\S+)/api/bench/(\S+) \(the daemon's store\)`).FindStringSubmatch(out)
	if m == nil || m[1] != url {
		t.Fatalf("not saved in the daemon's store:\n%s", out)
	}
	if r, err := bench.NewStore(f.Cfg.StateDir, nil).Load(m[2]); err != nil || r.Capacity == nil {
		t.Fatalf("the daemon's store: %v", err)
	}
	if out, _, err := runCmd(t, deps, "show", m[2], "--url", url); err != nil || !strings.Contains(out, m[2]) {
		t.Errorf("show %s: %v\n%s", m[2], err, out)
	}
	if all, _, _ := bench.NewStore(state, nil).List(); len(all) != 0 {
		t.Errorf("%d results in the local folder, want 0", len(all))
	}
}
