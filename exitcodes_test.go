package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/testkit"
)

// The classes of the exit-code contract a command is run into, the
// columns of exitTable.
const (
	cFlag    = "unknown flag"
	cValue   = "bad value"
	cArgs    = "arguments"
	cName    = "unknown name"
	cDown    = "unreachable"
	cConfig  = "config"
	cProblem = "problem"
)

var exitClasses = []string{cFlag, cValue, cArgs, cName, cDown, cConfig, cProblem}

// exitCase is one real process: the arguments after `gpuhost`, with
// placeholders exitPlaces fills in, and the status it must end with.
type exitCase struct {
	class string
	args  []string
	want  int
	// quiet: stderr must be the one error line, nothing logged before it
	// (the command refused before starting anything).
	quiet bool
}

func ec(class string, want int, args ...string) exitCase {
	return exitCase{class: class, args: args, want: want}
}

// unknownFlag is the unknown-flag case every command has.
func unknownFlag() exitCase { return ec(cFlag, 64, "--no-such-flag") }

// exitTable holds, for every command of the tree (its cobra path), the
// processes that run it into each class of the contract it can reach,
// with the status written out (never computed by the code under test).
// Placeholders: {down} a loopback URL where nothing listens, {daemon} a
// running demo, {missing} a config file that does not exist, {bad} one
// that is not YAML, {good} a valid config whose listen has no daemon and
// whose GPU (nvml, none here) fails the doctor, {public} a wildcard
// listen address, {dir} an empty folder, {eml} a mail file, {failedrun}
// the id of a failed bench run kept in the folder {failed}.
var exitTable = map[string][]exitCase{
	"gpuhost": {unknownFlag(), ec(cArgs, 64, "no-such-command")},
	"gpuhost serve": {unknownFlag(), ec(cValue, 64, "--log-level", "loud"), ec(cArgs, 64, "extra"),
		ec(cConfig, 78, "--config", "{missing}"), ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost demo": {unknownFlag(), ec(cValue, 64, "--log-level", "loud"), ec(cValue, 64, "--config", "{good}"), ec(cArgs, 64, "extra"),
		{class: cConfig, args: []string{"--listen", "{public}", "--state-dir", "{dir}"}, want: 78, quiet: true}},
	"gpuhost status": {unknownFlag(), ec(cValue, 64, "--url", "notaurl"), ec(cArgs, 64, "extra"), ec(cDown, 69, "--url", "{down}"),
		ec(cConfig, 78, "--config", "{missing}"), ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost switch": {unknownFlag(), ec(cValue, 64, "p", "--url", "notaurl"), ec(cArgs, 64), ec(cArgs, 64, "a", "b"),
		ec(cName, 64, "nosuch", "--url", "{daemon}"), ec(cDown, 69, "p", "--url", "{down}"), ec(cConfig, 78, "p", "--config", "{missing}")},
	"gpuhost heal": {unknownFlag(), ec(cValue, 64, "--url", "notaurl"), ec(cArgs, 64, "extra"), ec(cDown, 69, "--url", "{down}"),
		ec(cConfig, 78, "--config", "{missing}"), ec(cProblem, 1, "--url", "{daemon}")},
	"gpuhost doctor": {unknownFlag(), ec(cValue, 64, "--url", "notaurl"), ec(cArgs, 64, "extra"),
		ec(cName, 64, "--profile", "nosuch", "--url", "{daemon}"), ec(cName, 64, "--profile", "nosuch", "--config", "{good}"),
		ec(cDown, 69, "--url", "{down}"), ec(cConfig, 78, "--config", "{missing}"), ec(cConfig, 78, "--config", "{bad}"),
		ec(cProblem, 1, "--config", "{good}")},
	"gpuhost units":         {unknownFlag(), ec(cArgs, 64, "nosuch")},
	"gpuhost units render":  {unknownFlag(), ec(cArgs, 64, "extra"), ec(cConfig, 78, "--config", "{missing}"), ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost units install": {unknownFlag(), ec(cArgs, 64, "extra"), ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost simulate":      {unknownFlag(), ec(cValue, 64, "vllm", "--port", "notaport"), ec(cName, 64, "nosuch")},
	"gpuhost version":       {unknownFlag(), ec(cArgs, 64, "extra")},
	"gpuhost opencode-config": {unknownFlag(), ec(cValue, 64, "--url", "notaurl"), ec(cArgs, 64, "extra"), ec(cDown, 69, "--url", "{down}"),
		ec(cConfig, 78, "--config", "{missing}")},
	"gpuhost client-config": {unknownFlag(), ec(cValue, 64, "opencode", "--url", "notaurl"), ec(cArgs, 64), ec(cArgs, 64, "opencode", "PATH"),
		ec(cName, 64, "vscode"), ec(cDown, 69, "opencode", "--url", "{down}"), ec(cConfig, 78, "opencode", "--config", "{missing}")},
	"gpuhost bench": {unknownFlag(), ec(cArgs, 64, "nosuch")},
	"gpuhost bench run": {unknownFlag(), ec(cValue, 64, "--repeats", "x"), ec(cArgs, 64, "extra"),
		ec(cName, 64, "--profile", "nosuch", "--url", "{down}/v1", "--config", "{good}"),
		ec(cDown, 69, "--url", "{down}", "--repeats", "1", "--dir", "{dir}"), ec(cConfig, 78, "--config", "{missing}"),
		ec(cProblem, 1, "--url", "{daemon}/api/status", "--repeats", "1", "--dir", "{dir}")},
	"gpuhost bench switch": {unknownFlag(), ec(cValue, 64, "a", "b", "--rounds", "0"), ec(cArgs, 64, "a"),
		ec(cName, 64, "qwen3-coder", "nosuch", "--url", "{daemon}"), ec(cDown, 69, "a", "b", "--url", "{down}"),
		ec(cConfig, 78, "a", "b", "--config", "{missing}")},
	"gpuhost bench capacity": {unknownFlag(), ec(cValue, 64, "--url", "{down}", "--ttft-p95", "1s", "--max-concurrency", "0"), ec(cArgs, 64, "extra"),
		ec(cDown, 69, "--url", "{down}", "--ttft-p95", "1s", "--dir", "{dir}"), ec(cConfig, 78, "--config", "{missing}", "--ttft-p95", "1s")},
	// list, show and compare read the local store when no daemon answers
	// (said on stderr): unreachable is not one of their endings.
	"gpuhost bench list": {unknownFlag(), ec(cArgs, 64, "extra")},
	"gpuhost bench show": {unknownFlag(), ec(cArgs, 64), ec(cName, 64, "nosuch", "--dir", "{dir}"), ec(cName, 64, "nosuch", "--url", "{daemon}")},
	"gpuhost bench compare": {unknownFlag(), ec(cValue, 64, "a", "b", "--alpha", "2", "--dir", "{dir}"), ec(cArgs, 64, "a"),
		ec(cName, 64, "a", "b", "--dir", "{dir}"), ec(cProblem, 1, "{failedrun}", "{failedrun}", "--dir", "{failed}")},
	"gpuhost mcp": {unknownFlag(), ec(cArgs, 64, "nosuch"), ec(cConfig, 78, "--config", "{missing}"), ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost mcp test": {unknownFlag(), ec(cArgs, 64, "a", "b"), ec(cName, 64, "nosuch", "--config", "{good}"),
		ec(cConfig, 78, "--config", "{missing}"), ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost mcp tools": {unknownFlag(), ec(cValue, 64, "--url", "notaurl"), ec(cArgs, 64, "extra"), ec(cDown, 69, "--url", "{down}"),
		ec(cConfig, 78, "--config", "{missing}")},
	"gpuhost ask": {unknownFlag(), ec(cValue, 64, "q", "--url", "notaurl"), ec(cArgs, 64), ec(cDown, 69, "q", "--url", "{down}"),
		ec(cConfig, 78, "q", "--config", "{missing}")},
	"gpuhost triage": {unknownFlag(), ec(cArgs, 64, "nosuch")},
	"gpuhost triage run": {unknownFlag(), ec(cArgs, 64, "extra"), ec(cConfig, 78), ec(cConfig, 78, "--config", "{missing}"),
		ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost triage once": {unknownFlag(), ec(cArgs, 64, "extra"), ec(cConfig, 78), ec(cConfig, 78, "--config", "{missing}"),
		ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost triage mail": {unknownFlag(), ec(cValue, 64, "--uid", "x"), ec(cValue, 64, "--eml", "{dir}/none.eml"), ec(cArgs, 64),
		ec(cArgs, 64, "extra"), ec(cDown, 69, "--eml", "{eml}", "--url", "{down}"), ec(cConfig, 78, "--uid", "1", "--config", "{missing}")},
	"gpuhost pair":      {unknownFlag(), ec(cArgs, 64, "nosuch")},
	"gpuhost pair list": {unknownFlag(), ec(cArgs, 64, "extra"), ec(cConfig, 78, "--config", "{missing}"), ec(cConfig, 78, "--config", "{bad}")},
	"gpuhost pair add":  {unknownFlag(), ec(cValue, 64, "bob"), ec(cArgs, 64), ec(cConfig, 78, "5", "--config", "{missing}")},
	"gpuhost pair approve": {unknownFlag(), ec(cValue, 64, "NOPE", "--config", "{good}"), ec(cArgs, 64),
		ec(cName, 64, "ABCDEFGH", "--config", "{good}"), ec(cConfig, 78, "ABCDEFGH", "--config", "{missing}")},
	"gpuhost pair purge": {unknownFlag(), ec(cArgs, 64, "extra"), ec(cConfig, 78, "--config", "{missing}")},
	"gpuhost pair revoke": {unknownFlag(), ec(cValue, 64, "bob"), ec(cArgs, 64), ec(cName, 64, "12345", "--config", "{good}"),
		ec(cConfig, 78, "5", "--config", "{missing}")},
	"gpuhost help":                  {unknownFlag(), ec(cName, 64, "nosuch"), ec(cName, 64, "bench", "nosuch")},
	"gpuhost completion":            {unknownFlag(), ec(cArgs, 64, "nosuch")},
	"gpuhost completion bash":       {unknownFlag(), ec(cArgs, 64, "extra")},
	"gpuhost completion zsh":        {unknownFlag(), ec(cArgs, 64, "extra")},
	"gpuhost completion fish":       {unknownFlag(), ec(cArgs, 64, "extra")},
	"gpuhost completion powershell": {unknownFlag(), ec(cArgs, 64, "extra")},
	// A help topic, not a command: it has no arguments to get wrong.
	"gpuhost exit-codes": {unknownFlag()},
}

// allCommands returns the cobra path of every command in the tree.
func allCommands(c *cobra.Command) []string {
	out := []string{c.CommandPath()}
	for _, sub := range c.Commands() {
		out = append(out, allCommands(sub)...)
	}
	return out
}

// TestExitCodeEveryCommand walks cobra's whole command tree and runs each
// command, as a separate process of the built binary, into every class of
// the exit-code contract it can reach (exitTable). A command without a
// row fails the test, so a new command must say how it ends.
func TestExitCodeEveryCommand(t *testing.T) {
	tree := allCommands(newRootCmd())
	if len(tree) < 40 {
		t.Fatalf("only %d commands found: the walk is broken", len(tree))
	}
	for _, path := range tree {
		if rows := exitTable[path]; len(rows) == 0 || rows[0].class != cFlag {
			t.Errorf("%s: no row in exitTable (its first case the unknown flag); say how the command ends in each class", path)
		}
	}
	for path := range exitTable {
		if !slices.Contains(tree, path) {
			t.Errorf("exitTable has a row for %q, which is not a command", path)
		}
	}
	places := exitPlaces(t)
	type job struct {
		path string
		c    exitCase
	}
	var jobs []job
	for _, path := range tree {
		for _, c := range exitTable[path] {
			jobs = append(jobs, job{path, c})
		}
	}
	results := make([]string, len(jobs))
	codes := make([]int, len(jobs))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			args := append(strings.Fields(strings.TrimPrefix(j.path, "gpuhost")), fill(j.c.args, places)...)
			out, errOut, code := runIsolated(places["{home}"], args)
			codes[i] = code
			switch {
			case code != j.c.want:
				results[i] = fmt.Sprintf("gpuhost %s (%s): exit %d, want %d\nstdout: %.300s\nstderr: %.600s", strings.Join(args, " "), j.c.class, code, j.c.want, out, errOut)
			case j.c.class == cFlag && !strings.Contains(errOut, "no-such-flag"):
				results[i] = fmt.Sprintf("gpuhost %s: the error does not name the flag: %q", strings.Join(args, " "), errOut)
			case j.c.quiet && strings.Count(strings.TrimSpace(errOut), "\n") > 0:
				results[i] = fmt.Sprintf("gpuhost %s: more than the error on stderr (something ran first):\n%s", strings.Join(args, " "), errOut)
			}
		}()
	}
	wg.Wait()
	for _, r := range results {
		if r != "" {
			t.Error(r)
		}
	}
	t.Logf("%d processes run\n%s", len(jobs), exitMatrix(tree, func(path, class string) []int {
		var got []int
		for i, j := range jobs {
			if j.path == path && j.c.class == class {
				got = append(got, codes[i])
			}
		}
		return got
	}))
}

// exitMatrix renders commands × classes with the statuses seen.
func exitMatrix(tree []string, cell func(path, class string) []int) string {
	var b strings.Builder
	b.WriteString("| command | " + strings.Join(exitClasses, " | ") + " |\n|---" + strings.Repeat("|---", len(exitClasses)) + "|\n")
	for _, path := range tree {
		b.WriteString("| `" + path + "` |")
		for _, class := range exitClasses {
			var s []string
			for _, c := range cell(path, class) {
				s = append(s, fmt.Sprint(c))
			}
			b.WriteString(" " + strings.Join(s, ", ") + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// fill replaces the placeholders in args.
func fill(args []string, places map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range places {
			a = strings.ReplaceAll(a, k, v)
		}
		out[i] = a
	}
	return out
}

// runIsolated runs the binary with a home of its own and none of the
// variables that name a daemon or a token.
func runIsolated(home string, args []string) (stdout, stderr string, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != envDaemonURL && k != "GPUHOST_API_TOKEN" && !strings.HasPrefix(k, "XDG_") && k != "HOME" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+home)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		return "", err.Error(), -1
	}
	return o.String(), e.String(), code
}

// exitPlaces writes the files the table's placeholders name and starts the
// demo daemon some rows need.
func exitPlaces(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := strings.Replace(string(config.Example), "listen: 127.0.0.1:8080", fmt.Sprintf("listen: 127.0.0.1:%d", testkit.FreePort(t)), 1)
	good = strings.Replace(good, "state_dir: /var/lib/gpuhost", "state_dir: "+filepath.Join(dir, "state"), 1)
	empty := filepath.Join(dir, "empty")
	home := filepath.Join(dir, "home")
	for _, d := range []string{empty, home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	failed := filepath.Join(dir, "failed")
	down := "http://" + testkit.FreeAddr(t)
	// A run against nothing, kept: compare must refuse it (1).
	if _, errOut, code := runIsolated(home, []string{"bench", "run", "--url", down, "--repeats", "1", "--keep-failed", "--dir", failed}); code != 69 {
		t.Fatalf("bench run --keep-failed against %s: exit %d, want 69\n%s", down, code, errOut)
	}
	kept, _ := filepath.Glob(filepath.Join(failed, "*.json"))
	if len(kept) != 1 {
		t.Fatalf("bench run --keep-failed stored %v, want one result", kept)
	}
	return map[string]string{
		"{failed}":    failed,
		"{failedrun}": strings.TrimSuffix(filepath.Base(kept[0]), ".json"),
		"{down}":      down,
		"{daemon}":    startExitDemo(t),
		"{missing}":   filepath.Join(dir, "none.yaml"),
		"{bad}":       write("bad.yaml", "listen: [\n"),
		"{good}":      write("good.yaml", good),
		"{public}":    fmt.Sprintf("0.0.0.0:%d", testkit.FreePort(t)),
		"{dir}":       empty,
		"{eml}":       write("m.eml", "From: a@b.example\r\nSubject: hi\r\n\r\nhello\r\n"),
		"{home}":      home,
	}
}

// startExitDemo runs `gpuhost demo` until the test ends and returns its
// URL once its API answers.
func startExitDemo(t *testing.T) string {
	t.Helper()
	addr := testkit.FreeAddr(t)
	cmd := exec.Command(binPath, "demo", "--listen", addr, "--state-dir", t.TempDir())
	var logs testkit.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGINT); _ = cmd.Wait() })
	url := "http://" + addr
	c := api.NewClient(url, "")
	if !testkit.Poll(30*time.Second, func() bool { _, err := c.Status(context.Background()); return err == nil }) {
		t.Fatalf("the demo did not answer at %s:\n%s", url, logs.String())
	}
	return url
}

// TestHelpExitCodes: `gpuhost help exit-codes` states the contract.
func TestHelpExitCodes(t *testing.T) {
	out, code := gpuhost(t, "help", "exit-codes")
	for _, w := range []string{"0 ", "1 ", "64 ", "69 ", "78 "} {
		if code != 0 || !strings.Contains(out, "\n  "+w) {
			t.Errorf("help exit-codes: exit %d, no line for %q:\n%s", code, w, out)
		}
	}
}
