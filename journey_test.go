package main

import (
	"bufio"
	"context"
	"errors"
	"net"
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
			"democonsole": demoConsoleCmd,
			"rc":          exitCodeCmd,
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

// startDemoCmd is `startdemo`: `gpuhost demo` on a free port with its state
// under $WORK, stopped with Ctrl-C when the script ends; it waits until
// the default profile is active and exports GPUHOST_URL, as the banner
// tells the user to.
func startDemoCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: startdemo")
	}
	journeyDemoSlot <- struct{}{}
	ts.Defer(func() { <-journeyDemoSlot }) // runs after the demo's stop below
	l, err := net.Listen("tcp", "127.0.0.1:0")
	ts.Check(err)
	addr := l.Addr().String()
	ts.Check(l.Close())
	cmd := exec.Command(binPath, "demo", "--listen", addr, "--state-dir", ts.MkAbs("demo-state"))
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
		ts.Fatalf("the demo did not activate qwen3-coder:\n%s", console.String())
	}
	ts.Setenv(envDaemonURL, url)
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
