package appliance

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// healEpisode is one action on the box and what it led to, measured.
type healEpisode struct {
	name        string
	took        time.Duration // from the action to the end state
	samples     int           // residual sampler readings during the episode
	both        int           // of which with two backends above their residual
	overlapHint time.Duration // both × the episode's mean sample period
	idlePolls   int           // /api/status polls that showed idle or failed
	polls       int
	end         api.State
	events      []string // the crash, heal, hand, paused and exclusion events
}

// TestSystemdHealAndHandActions: under a real private systemd with the
// rendered units (backends Restart=no) and the default 2 s watch
// interval, so hand actions are found by systemd's D-Bus signals:
//
//   - kill -9 of the active backend: healed, a /v1 request sent meanwhile
//     is held and answered;
//   - `systemctl restart` of the active backend: followed and re-proved;
//   - `systemctl stop` of the active backend: paused (nothing wanted), and
//     a hand `systemctl start` of it resumes;
//   - both backend units stopped, then both started by hand: the wanted
//     profile serves, the other goes into standby;
//   - the unit in standby stopped, started and loaded by hand through its
//     socket: put back into standby;
//   - a backend that crashes at every start: restarted heal.max_restarts
//     times, then failed; the doctor fails naming it; heal brings it back.
//
// Each episode's overlap (two backends above their residual) is bounded by
// the hand watch interval plus the offload, not by the watch interval.
func TestSystemdHealAndHandActions(t *testing.T) {
	state := t.TempDir()
	crashFile := filepath.Join(state, "crash")
	e := startE2EWith(t, "100ms", state, func(y string) string {
		y = standbyE2EYAML(y)
		y = strings.Replace(y, "  standby_watch_interval: 100ms\n", "  standby_watch_interval: 2s\n", 1)
		y = strings.Replace(y, "simulate, vllm, --sim-dir", "simulate, vllm, --crash-file, "+crashFile+", --sim-dir", 1)
		return y + "heal: {max_restarts: 3, window: 10m, backoff: 1s, max_backoff: 2s}\n"
	}, nil)
	vllm, ollama := e.cfg.Backends.VLLM.Unit, e.cfg.Backends.Ollama.Unit
	llama := e.cfg.Profiles["llama"]
	s := startResidualSampler(t, e)
	systemctl := func(args ...string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if out, err := e.sd.Systemctl(ctx, args...); err != nil {
			t.Fatalf("systemctl %v: %v %s", args, err, out)
		}
	}
	for _, p := range []string{"coder", "llama", "coder"} {
		e.switchTo(t, p)
	}
	active := func(profile string) func(api.Status) bool {
		return func(st api.Status) bool {
			return st.State.Phase == api.PhaseActive && st.State.Step == "" && st.State.Profile == profile
		}
	}
	var results []healEpisode
	run := func(name string, do func(), done func(api.Status) bool) healEpisode {
		t.Helper()
		r := healEpisode{name: name}
		seq := e.lastSeq(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				st, err := e.client.Status(ctx)
				cancel()
				r.polls++
				if err == nil && (st.State.Phase == api.PhaseIdle || st.State.Phase == api.PhaseFailed) {
					r.idlePolls++
				}
			}
		}()
		s.command(t, "EPISODE START")
		t0 := time.Now()
		do()
		r.end = e.waitState(t, name, 90*time.Second, done).State
		r.took = time.Since(t0)
		// Whatever the watcher still does about it (a unit put back into
		// standby) belongs to the episode.
		time.Sleep(500 * time.Millisecond)
		end := s.command(t, "EPISODE END")
		close(stop)
		wg.Wait()
		r.samples, r.both = end.EpisodeSamples, end.EpisodeBoth
		if r.samples > 0 {
			r.overlapHint = time.Duration(r.both) * time.Since(t0) / time.Duration(r.samples)
		}
		r.events = e.eventsSince(t, seq, "crash", "heal", "hand", "paused", "exclusion", "standby")
		results = append(results, r)
		if len(end.Holding.Above) > 1 {
			t.Errorf("%s: after it two backends above their residual: %s", name, end.Holding)
		}
		return r
	}

	// kill -9 of the active vLLM: healed; a request sent meanwhile is held.
	oldPID := e.mainPID(t, vllm)
	held := make(chan error, 1)
	r := run("kill -9 of the active vllm (coder)", func() {
		systemctl("kill", "--signal=KILL", vllm)
		go func() {
			// Once gpuhost saw the crash (systemd's signal), requests are
			// held until the restart serves. (One that reaches the relay
			// in the moment before fails as the backend's own error: the
			// relay accepted it, so it is not retried as a refused dial.)
			seen := false
			for deadline := time.Now().Add(10 * time.Second); !seen && time.Now().Before(deadline); {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				st, err := e.client.Status(ctx)
				cancel()
				seen = err == nil && st.State.Phase == api.PhaseSwitching
			}
			held <- e.chat(t, "qwen3-coder")
		}()
	}, func(st api.Status) bool {
		return active("coder")(st) && unitPID(st, vllm) != oldPID && unitPID(st, vllm) != 0
	})
	if err := <-held; err != nil {
		t.Errorf("a /v1 request sent during the heal: %v", err)
	}
	if !hasEvent(r.events, "crash", "signal") || !hasEvent(r.events, "heal", "serves again") {
		t.Errorf("kill -9: events %v, want a crash (signal) and a heal", r.events)
	}

	// systemctl restart of the active vLLM: followed, re-proved.
	oldPID = e.mainPID(t, vllm)
	r = run("systemctl restart of the active vllm (coder)", func() { systemctl("restart", vllm) },
		func(st api.Status) bool { return active("coder")(st) && unitPID(st, vllm) != oldPID })
	if hasEvent(r.events, "crash", "") || hasEvent(r.events, "paused", "") || !hasEvent(r.events, "hand", "restarted by hand") {
		t.Errorf("a hand restart was taken for a crash or a stop, or not proved again: %v", r.events)
	}

	// systemctl stop of the active Ollama while the vLLM sleeps: paused.
	e.switchTo(t, "llama")
	r = run("systemctl stop of the active ollama (llama)", func() { systemctl("stop", ollama) },
		func(st api.Status) bool { return st.State.Phase == api.PhaseIdle && st.State.Paused == "llama" })
	if r.end.LastWanted != "" || r.end.NotServing != "" || !hasEvent(r.events, "paused", "stopped by hand") {
		t.Errorf("hand stop: state %+v, events %v", r.end, r.events)
	}
	if c := e.doctorCheck(t, "state.last_wanted"); c.Severity != units.SeverityWarn || !strings.Contains(c.Fix, "gpuhost heal") {
		t.Errorf("doctor after a hand stop: %+v", c)
	}
	r = run("systemctl start of the stopped ollama (resume)", func() { systemctl("start", ollama) },
		func(st api.Status) bool { return active("llama")(st) && st.State.LastWanted == "llama" })

	// Both units stopped, then both started by hand, no profile active.
	systemctl("stop", vllm, ollama)
	e.waitState(t, "both stopped", 30*time.Second, func(st api.Status) bool {
		return st.State.Phase == api.PhaseIdle && len(st.State.Standby) == 0
	})
	r = run("both units started by hand (llama wanted)", func() { systemctl("start", vllm, ollama) },
		func(st api.Status) bool { return active("llama")(st) && inStandby(st, "coder") })
	if !hasEvent(r.events, "exclusion", "none is active") {
		t.Errorf("both started by hand: events %v", r.events)
	}

	// The Ollama in standby stopped, started and loaded by hand.
	e.switchTo(t, "coder")
	hc := e.backendHTTP(60 * time.Second)
	handLoad := func(name string, waitAdopted bool) {
		loadSeq := e.lastSeq(t)
		run(name, func() {
			systemctl("stop", ollama)
			systemctl("start", ollama)
			if waitAdopted {
				e.waitState(t, "adopted", 30*time.Second, func(st api.Status) bool { return inStandby(st, "llama") })
			}
			var err error
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				var resp *http.Response
				resp, err = hc.Post(fmt.Sprintf("http://127.0.0.1:%d/api/generate", llama.Port), "application/json",
					strings.NewReader(`{"model":"llama3.1:8b","prompt":"hi","stream":false}`))
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
					err = fmt.Errorf("HTTP %d", resp.StatusCode)
				}
			}
			if err != nil {
				t.Errorf("the hand load: %v", err)
			}
		}, func(st api.Status) bool {
			// Put back into standby (or, when it would not settle, stopped).
			evs := e.eventsSince(t, loadSeq, "exclusion")
			return active("coder")(st) && (hasEvent(evs, "exclusion", "back into standby") || hasEvent(evs, "exclusion", "put into standby") ||
				hasEvent(evs, "exclusion", "stopped"))
		})
	}
	handLoad("stop+start of the ollama in standby, then a hand load", false)
	// The load after the adoption: no unit event of its own, found by the
	// 100 ms look that follows a hand action, not the 2 s interval.
	handLoad("stop+start of the ollama in standby, adopted, then a hand load", true)

	// A crash loop: every start crashes. Starts are spaced beyond systemd's
	// default start limit (5 in 10 s) of the units as rendered.
	time.Sleep(10 * time.Second)
	if err := os.WriteFile(crashFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r = run("crash loop of coder (crashes at every start)", func() { systemctl("kill", "--signal=KILL", vllm) },
		func(st api.Status) bool {
			return st.State.Phase == api.PhaseFailed && strings.Contains(st.State.Error, "stopped restarting")
		})
	crashes, restarts := 0, 0
	for _, ev := range r.events {
		if strings.HasPrefix(ev, "crash ") {
			crashes++
		}
	}
	restarts = crashes - 1
	if crashes != 4 || !strings.Contains(r.end.Error, "crashed 4 times") || r.end.NotServing == "" {
		t.Errorf("crash loop: %d crashes (%d restarts), state %+v; events %v", crashes, restarts, r.end, r.events)
	}
	c := e.doctorCheck(t, "state.last_wanted")
	if c.Severity != units.SeverityFail || !strings.Contains(c.Message, "crashed 4 times") {
		t.Errorf("doctor after the crash loop: %+v", c)
	}
	t.Logf("doctor after the crash loop: %s %s: %s; fix: %s", c.Severity, c.ID, c.Message, c.Fix)
	if err := os.Remove(crashFile); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	err := e.client.HealAndFollow(ctx, func(api.Event) {})
	cancel()
	if err != nil {
		t.Fatalf("gpuhost heal: %v", err)
	}
	e.waitState(t, "healed", 30*time.Second, active("coder"))

	bound := handWatchInterval + residualSettledFor + time.Second
	for _, r := range results {
		t.Logf("%-52s end state after %6s: %s %s (wanted %q, paused %q, standby %v); two holders in %3d of %3d samples (≈%s); idle/failed polls %d/%d",
			r.name, r.took.Round(time.Millisecond), r.end.Phase, r.end.Profile, r.end.LastWanted, r.end.Paused, standbyNames(r.end), r.both, r.samples,
			r.overlapHint.Round(time.Millisecond), r.idlePolls, r.polls)
		for _, ev := range r.events {
			t.Logf("    %s", ev)
		}
		if r.overlapHint > bound {
			t.Errorf("%s: two backends above their residual for ≈%s, over the %s bound", r.name, r.overlapHint, bound)
		}
	}
	if r := results[0]; r.idlePolls > 0 {
		t.Errorf("kill -9: %d status polls showed idle or failed while it was healed (requests would be refused)", r.idlePolls)
	}
}

func unitPID(st api.Status, unit string) int {
	for _, u := range st.Units {
		if u.Name == unit && u.ActiveState == "active" {
			return u.MainPID
		}
	}
	return 0
}

func inStandby(st api.Status, profile string) bool {
	for _, sb := range st.State.Standby {
		if sb.Profile == profile {
			return true
		}
	}
	return false
}

func standbyNames(st api.State) []string {
	var out []string
	for _, sb := range st.Standby {
		out = append(out, sb.Profile)
	}
	return out
}

func hasEvent(evs []string, kind, contains string) bool {
	for _, ev := range evs {
		if strings.HasPrefix(ev, kind+" ") && strings.Contains(ev, contains) {
			return true
		}
	}
	return false
}

// lastSeq is the newest event's sequence number.
func (e *e2e) lastSeq(t *testing.T) uint64 {
	t.Helper()
	var last uint64
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.client.Events(ctx, "/api/events?since=0", func(ev api.Event) bool {
		last = max(last, ev.Seq)
		return true
	})
	return last
}

// eventsSince lists the events of the given kinds after seq as
// "kind status: message".
func (e *e2e) eventsSince(t *testing.T, seq uint64, kinds ...api.EventKind) []string {
	t.Helper()
	var out []string
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.client.Events(ctx, fmt.Sprintf("/api/events?since=%d", seq), func(ev api.Event) bool {
		for _, k := range kinds {
			if ev.Kind == k {
				out = append(out, fmt.Sprintf("%s %s: %s", ev.Kind, ev.Status, ev.Message))
			}
		}
		return true
	})
	return out
}

// doctorCheck runs the daemon's doctor and returns one check.
func (e *e2e) doctorCheck(t *testing.T, id string) api.DoctorCheck {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := e.client.Doctor(ctx, "")
	if err != nil {
		t.Fatalf("doctor: %v", err)
	}
	return findCheck(rep, id)
}

// chat sends one chat request through the daemon's /v1.
func (e *e2e) chat(t *testing.T, model string) error {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, model)
	req, err := http.NewRequest(http.MethodPost, e.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}
