package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"gpuhost/api"
	"gpuhost/internal/loopback"
	"gpuhost/internal/testkit"
)

// TestJourneys runs the txtar scripts in testdata/journeys: each starts a
// real `gpuhost demo` process (startdemo) and types the commands a user
// types — the README's walk-through among them — with the gpuhost binary
// on PATH as `make install` puts it, asserting their output and exit codes.
func TestJourneys(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: filepath.Join("testdata", "journeys"),
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", filepath.Dir(binPath)+string(os.PathListSeparator)+os.Getenv("PATH"))
			env.Setenv("HOME", filepath.Join(env.WorkDir, "home"))
			env.Setenv("XDG_CONFIG_HOME", "")
			env.Setenv("XDG_STATE_HOME", "")
			env.Setenv(envDaemonURL, "")
			return os.MkdirAll(filepath.Join(env.WorkDir, "home"), 0o755)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"startdemo":   startDemoCmd,
			"startserve":  startServeCmd,
			"democonsole": demoConsoleCmd,
			"rc":          exitCodeCmd,
			"backendpost": backendPostCmd,
			"killbackend": killBackendCmd,
			"waitmetric":  waitMetricCmd,
			"v1models":    v1ModelsCmd,
		},
	})
}

// journeyDemos holds each script's demo console, by work directory.
var journeyDemos sync.Map

// journeyDemoSlot lets one journey's demo run at a time: testscript runs
// the scripts in parallel, and two demos starting at the same instant both
// find the profiles' default ports free (the demo moves only ports that
// are taken when it looks).
var journeyDemoSlot = make(chan struct{}, 1)

// startDemoCmd is `startdemo [--gpus N]`: `gpuhost demo` on a free port with its state
// under $WORK, stopped with Ctrl-C when the script ends; it waits until
// the default profile is active and exports GPUHOST_URL, as the banner
// tells the user to.
func startDemoCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || (len(args) != 0 && (len(args) != 2 || args[0] != "--gpus")) {
		ts.Fatalf("usage: startdemo [--gpus N]")
	}
	runDaemon(ts, func(addr string) []string {
		return append([]string{"demo", "--listen", addr, "--state-dir", ts.MkAbs("demo-state")}, args...)
	})
}

// startServeCmd is `startserve CONFIG`: `gpuhost serve --config CONFIG` as
// an operator runs it, after filling in the script's {{SELF}} (the gpuhost
// binary), {{STATE}} (a state folder under $WORK), {{LISTEN}} (a free
// address) and {{PORT1}}, {{PORT2}} (free ports for the backends), like the
// demo's embedded config; it waits and exports GPUHOST_URL like startdemo.
func startServeCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: startserve CONFIG")
	}
	tmpl := ts.ReadFile(args[0])
	runDaemon(ts, func(addr string) []string {
		r := strings.NewReplacer("{{SELF}}", binPath, "{{STATE}}", ts.MkAbs("serve-state"), "{{LISTEN}}", addr,
			"{{PORT1}}", freePort(ts), "{{PORT2}}", freePort(ts))
		path := ts.MkAbs(args[0] + ".filled")
		ts.Check(os.WriteFile(path, []byte(r.Replace(tmpl)), 0o600))
		return []string{"serve", "--config", path}
	})
}

// runDaemon starts the gpuhost daemon command args(addr) on a free port,
// one journey's daemon at a time, and stops it with Ctrl-C when the script
// ends; it waits until qwen3-coder (the scripts' default profile) is active.
func runDaemon(ts *testscript.TestScript, args func(addr string) []string) {
	journeyDemoSlot <- struct{}{}
	ts.Defer(func() { <-journeyDemoSlot }) // runs after the daemon's stop below
	port, err := loopback.FreePort()
	ts.Check(err)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(binPath, args(addr)...)
	// The script's environment: its PATH (the binary on it) and HOME.
	cmd.Env = append(os.Environ(), "PATH="+ts.Getenv("PATH"), "HOME="+ts.Getenv("HOME"))
	cmd.Dir = ts.Getenv("WORK")
	out, err := cmd.StdoutPipe()
	ts.Check(err)
	cmd.Stderr = cmd.Stdout
	ts.Check(cmd.Start())
	console := &testkit.SyncBuffer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			console.Write([]byte(sc.Text() + "\n"))
		}
	}()
	journeyDemos.Store(ts.Getenv("WORK"), console)
	ts.Defer(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = cmd.Wait()
	})
	url := "http://" + addr
	c := api.NewClient(url, "")
	ok := testkit.Poll(120*time.Second, func() bool {
		st, err := c.Status(context.Background())
		return err == nil && st.State.Phase == api.PhaseActive && st.State.Profile == "qwen3-coder"
	})
	if !ok {
		ts.Fatalf("the daemon did not activate qwen3-coder:\n%s", console.String())
	}
	ts.Setenv(envDaemonURL, url)
}

// freePort is a loopback port free at this moment, for a daemon the
// script starts (loopback.FreePort: outside the kernel's ephemeral range).
func freePort(ts *testscript.TestScript) string {
	port, err := loopback.FreePort()
	ts.Check(err)
	return strconv.Itoa(port)
}

// backendPostCmd is `backendpost PROFILE PATH`: what a local process (or a
// page in a browser on the box) can do to the demo's backends, which listen
// on loopback TCP: a POST straight to the profile's backend port, behind
// gpuhost's back. Prints the status line.
func backendPostCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: backendpost PROFILE PATH")
	}
	c := api.NewClient(ts.Getenv(envDaemonURL), "")
	ps, err := c.Profiles(context.Background())
	ts.Check(err)
	port := 0
	for _, p := range ps {
		if p.Name == args[0] {
			port = p.Port
		}
	}
	if port == 0 {
		ts.Fatalf("backendpost: no profile %q", args[0])
	}
	resp, err := http.Post("http://127.0.0.1:"+strconv.Itoa(port)+args[1], "text/plain", nil)
	ts.Check(err)
	resp.Body.Close()
	ts.Logf("POST %s on %s's backend: %s", args[1], args[0], resp.Status)
}

// v1ModelsCmd is `v1models`: what a router in front of the box reads,
// GET /v1/models, printed one model per line ("ID STATUS STATE"; STATE is
// the card's gpuhost readiness: serving, switching, sleeping or cold).
func v1ModelsCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: v1models")
	}
	resp, err := http.Get(ts.Getenv(envDaemonURL) + "/v1/models")
	ts.Check(err)
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID      string `json:"id"`
			Status  string `json:"status"`
			Gpuhost *struct {
				State string `json:"state"`
			} `json:"gpuhost"`
		} `json:"data"`
	}
	ts.Check(json.NewDecoder(resp.Body).Decode(&list))
	for _, m := range list.Data {
		state := "-"
		if m.Gpuhost != nil {
			state = m.Gpuhost.State
		}
		fmt.Fprintf(ts.Stdout(), "%s %s %s\n", m.ID, m.Status, state)
	}
}

// killBackendCmd is `killbackend UNIT`: SIGKILL to the unit's main
// process, as `kill -9 PID` from `gpuhost status` would.
func killBackendCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: killbackend UNIT")
	}
	st, err := api.NewClient(ts.Getenv(envDaemonURL), "").Status(context.Background())
	ts.Check(err)
	for _, u := range st.Units {
		if u.Name == args[0] && u.MainPID > 0 {
			ts.Check(syscall.Kill(u.MainPID, syscall.SIGKILL))
			ts.Logf("kill -9 %d (%s)", u.MainPID, u.Name)
			return
		}
	}
	ts.Fatalf("killbackend: %s has no main process", args[0])
}

// waitMetricCmd is `waitmetric REGEXP`: polls the daemon's /metrics (60 s
// budget) until a line matches, for what the daemon does on its own (the
// watcher's repairs) and then counts.
func waitMetricCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitmetric REGEXP")
	}
	re, err := regexp.Compile("(?m)" + args[0])
	ts.Check(err)
	var last string
	ok := testkit.Poll(60*time.Second, func() bool {
		resp, err := http.Get(ts.Getenv(envDaemonURL) + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		last = string(b)
		return re.MatchString(last)
	})
	if !ok {
		ts.Fatalf("no /metrics line matches %q within 60 s; last scrape:\n%s", args[0], last)
	}
}

// demoConsoleCmd is `democonsole FILE`: what the demo printed so far
// (banner, logs, triage posts) into FILE, for grep.
func demoConsoleCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: democonsole FILE")
	}
	c, ok := journeyDemos.Load(ts.Getenv("WORK"))
	if !ok {
		ts.Fatalf("democonsole: no startdemo in this script")
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), []byte(c.(*testkit.SyncBuffer).String()), 0o644))
}

// exitCodeCmd is `rc N PROGRAM ARGS…`: runs it like exec (stdout and
// stderr kept for the next stdout/stderr lines) and asserts exit status N.
func exitCodeCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: rc CODE PROGRAM [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		got = ee.ExitCode()
	} else if err != nil {
		ts.Fatalf("%s: %v", args[1], err)
	}
	if got != want {
		ts.Fatalf("%s: exit %d, want %d", strings.Join(args[1:], " "), got, want)
	}
}

// TestWalkthroughIsAJourney: every command the README's walk-through shows
// (between its walkthrough markers) is run, as typed, by a journey script.
func TestWalkthroughIsAJourney(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "<!-- walkthrough:")
	block, _, ok2 := strings.Cut(block, "<!-- /walkthrough -->")
	if !ok || !ok2 {
		t.Fatal("README.md: no <!-- walkthrough: … --> … <!-- /walkthrough --> block")
	}
	var shown []string
	for _, line := range strings.Split(block, "\n") {
		if cmd, ok := strings.CutPrefix(strings.TrimSpace(line), "./bin/gpuhost "); ok {
			shown = append(shown, "gpuhost "+normQuotes(cmd))
		}
	}
	if len(shown) < 5 {
		t.Fatalf("only %d commands found in the walk-through: the parser is broken", len(shown))
	}
	run := journeyCommands(t)
	for _, s := range shown {
		if !run[s] {
			t.Errorf("the README's walk-through shows `%s`, which no journey in testdata/journeys runs", s)
		}
	}
}

// journeyCmdRe takes the command off a script line: `exec`, `! exec`,
// `rc N`, with an optional [condition].
var journeyCmdRe = regexp.MustCompile(`^(?:\[[^\]]*\]\s*)?(?:!\s*)?(?:exec|rc\s+\d+)\s+(gpuhost\b.*)$`)

// journeyCommands returns the gpuhost commands the journey scripts run.
func journeyCommands(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "journeys", "*.txtar"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no journeys: %v", err)
	}
	out := map[string]bool{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(line, "-- ") {
				break // the archive's files follow the script
			}
			if m := journeyCmdRe.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
				out[normQuotes(strings.TrimSpace(m[1]))] = true
			}
		}
	}
	return out
}

// normQuotes lets a README's "…" match a script's '…' (testscript quotes
// with single quotes only).
func normQuotes(s string) string { return strings.ReplaceAll(s, "'", `"`) }
