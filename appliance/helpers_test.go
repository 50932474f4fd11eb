package appliance

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testbin"
)

// gpuhostBinary and testConfigYAML come from internal/testbin,
// shared with the front-door packages' tests.
func gpuhostBinary(t testing.TB) string { return testbin.Binary(t) }

var testConfigYAML = testbin.ConfigYAML

// collect gathers the events of one switch until it ends.
func collect(t testing.TB, sup *Supervisor, since uint64, id string, timeout time.Duration) []api.Event {
	t.Helper()
	ch, backlog, cancel := sup.Subscribe(since)
	defer cancel()
	var out []api.Event
	seen := map[uint64]bool{}
	handle := func(e api.Event) bool {
		if seen[e.Seq] || e.SwitchID != id {
			return false
		}
		seen[e.Seq] = true
		out = append(out, e)
		return e.Kind == "switch" && (e.Status == "done" || e.Status == "failed")
	}
	for _, e := range backlog {
		if handle(e) {
			return out
		}
	}
	ctx, cc := context.WithTimeout(context.Background(), timeout)
	defer cc()
	for {
		select {
		case e := <-ch:
			if handle(e) {
				return out
			}
		case <-ctx.Done():
			t.Fatalf("switch %s did not finish within %s; events so far: %s", id, timeout, describe(out))
		}
	}
}

func describe(evs []api.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %s %s %s %s", e.Kind, e.Step, e.Status, e.Message)
	}
	return b.String()
}

func stepEvent(evs []api.Event, step string, status api.EventStatus) (api.Event, bool) {
	for _, e := range evs {
		if e.Kind == "step" && e.Step == step && e.Status == status {
			return e, true
		}
	}
	return api.Event{}, false
}

func itoa(n int) string { return fmt.Sprint(n) }

// startSleeper starts a process that lives until the test ends.
func startSleeper(t testing.TB) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}
