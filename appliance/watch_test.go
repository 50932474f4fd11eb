package appliance

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// watchSampler samples the Supervisor's state and the number of backends
// above their residual while a hand action plays out.
type watchSampler struct {
	f    *procFixture
	want string // the profile that must stay active
	stop chan struct{}
	done chan struct{}

	mu        sync.Mutex
	samples   int
	notActive int    // samples where want was not the active profile
	firstOff  string // the first such state
	overlap   time.Duration
	overStart time.Time
}

func (f *procFixture) sample(want string) *watchSampler {
	w := &watchSampler{f: f, want: want, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			st := f.sup.State()
			n := f.holdersNow()
			w.mu.Lock()
			w.samples++
			if st.Phase != api.PhaseActive || st.Profile != w.want {
				if w.notActive == 0 {
					w.firstOff = describeState(st)
				}
				w.notActive++
			}
			now := time.Now()
			switch {
			case n > 1 && w.overStart.IsZero():
				w.overStart = now
			case n <= 1 && !w.overStart.IsZero():
				w.overlap += now.Sub(w.overStart)
				w.overStart = time.Time{}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *watchSampler) end() *watchSampler {
	close(w.stop)
	<-w.done
	if !w.overStart.IsZero() {
		w.overlap += time.Since(w.overStart)
	}
	return w
}

// holdersNow is holders without a test to fail: -1 when unreadable.
func (f *procFixture) holdersNow() int {
	snap, err := f.gpu.Snapshot(context.Background())
	if err != nil {
		return -1
	}
	d, _ := snap.Device0()
	bs, err := f.sup.backends(context.Background())
	if err != nil {
		return -1
	}
	st := f.sup.State()
	n := 0
	for _, b := range bs {
		limit := uint64(residualToleranceMiB)
		for _, sb := range st.Standby {
			if sb.Unit == b.unit {
				limit += sb.ResidualMiB
			}
		}
		if unitUsedMiB(d, b.status) > limit {
			n++
		}
	}
	return n
}

// awaitEvent waits for the first event after since that match accepts.
func awaitEvent(t *testing.T, sup *Supervisor, since uint64, match func(api.Event) bool) api.Event {
	t.Helper()
	var got api.Event
	if !testkit.Poll(60*time.Second, func() bool {
		_, evs, cancel := sup.Subscribe(since)
		cancel()
		for _, e := range evs {
			if match(e) {
				got = e
				return true
			}
		}
		return false
	}) {
		_, evs, cancel := sup.Subscribe(since)
		cancel()
		t.Fatalf("no matching event:%s", describe(evs))
	}
	return got
}

// TestWatcherHandActionsOnUnits: a unit started by hand beside the active
// one (an empty Ollama; a vLLM that loads its weights; either restarted out
// of standby) is adopted into standby or put there, with an exclusion
// event, while the active profile keeps serving throughout; the time two
// backends held memory is logged.
func TestWatcherHandActionsOnUnits(t *testing.T) {
	tests := []struct {
		name, active, stray string
		restart             bool // stop and start at once: the standby record stays
		wantMsg, wantDrift  string
	}{
		{"empty ollama started beside vllm", "coder", "llama", false, "adopted into standby", driftStray},
		// Restarted, the empty Ollama is what its standby record says (or,
		// when the watcher saw it stopped, adopted again).
		{"ollama restarted beside vllm", "coder", "llama", true, "", ""},
		// A vLLM loading its weights holds memory before it answers: it
		// cannot be put into standby before the overlap, so it is stopped.
		{"vllm started beside ollama", "llama", "coder", false, "stopped", driftStray},
		// Restarted, the vLLM is above its standby record's residual (or,
		// when the watcher saw it stopped, a stray): stopped either way.
		{"vllm restarted beside ollama", "llama", "coder", true, "stopped", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newProcFixtureYAML(t, standbyYAML(t))
			awaitReconciled(t, f.sup)
			for _, p := range []string{tt.stray, tt.active} {
				if evs, err := f.switchTo(t, p); err != nil {
					t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
				}
			}
			unit := f.cfg.BackendFor(f.cfg.Profiles[tt.stray].Backend).Unit
			since := f.sup.LastSeq()
			w := f.sample(tt.active)
			ctx := context.Background()
			if err := f.sup.units.Stop(ctx, unit); err != nil {
				t.Fatal(err)
			}
			if !tt.restart {
				// Stopped by hand: the watcher forgets the standby.
				testkit.Eventually(t, 10*time.Second, func() bool { return len(f.sup.State().Standby) == 0 }, "the standby forgotten after a hand stop")
			}
			t0 := time.Now()
			if err := f.sup.units.Start(ctx, unit); err != nil {
				t.Fatal(err)
			}
			var e api.Event
			if tt.wantMsg != "" {
				e = awaitEvent(t, f.sup, since, func(e api.Event) bool { return e.Kind == "exclusion" })
			} else {
				testkit.Eventually(t, 10*time.Second, func() bool {
					st, err := f.sup.units.Unit(ctx, unit)
					return err == nil && st.ActiveState == "active"
				}, "the hand-started unit active")
				// Let the watcher look a few times; it must find nothing.
				time.Sleep(5 * f.cfg.GPU.StandbyWatchInterval.D())
				e = api.Event{Message: "no exclusion", Detail: map[string]any{"drift": ""}}
				_, evs, cancel := f.sup.Subscribe(since)
				cancel()
				for _, ev := range evs {
					if ev.Kind == "exclusion" {
						e = ev
						if !strings.Contains(ev.Message, "adopted into standby") {
							t.Errorf("exclusion after a restart of the empty Ollama: %q", ev.Message)
						}
					}
				}
			}
			decided := time.Since(t0)
			testkit.Eventually(t, 10*time.Second, func() bool { return f.holdersNow() == 1 }, "one holder again")
			w.end()
			t.Logf("%s: %s after %s; %d samples, two holders for %s, %d samples not serving %s",
				tt.name, e.Message, decided.Round(time.Millisecond), w.samples, w.overlap.Round(time.Millisecond), w.notActive, tt.active)
			if !strings.Contains(e.Message, tt.wantMsg) || !tt.restart && e.Detail["drift"] != tt.wantDrift {
				t.Errorf("exclusion event: %s %q %v", e.Status, e.Message, e.Detail)
			}
			if w.notActive > 0 {
				t.Errorf("%s stopped being active in %d of %d samples, first: %s", tt.active, w.notActive, w.samples, w.firstOff)
			}
			adopted := !strings.Contains(tt.wantMsg, "stopped")
			violations, _, _ := f.sup.Exclusion()
			by, _, _, unresolved := f.sup.Drift()
			if !tt.restart && (violations != 0 || by[driftStray] != 1) || violations+by[driftStray] > 1 || unresolved != "" {
				t.Errorf("standby violations %d, drift %v, unresolved %q", violations, by, unresolved)
			}
			st := f.sup.State()
			if st.Phase != api.PhaseActive || st.Profile != tt.active || (len(st.Standby) == 1) != adopted ||
				adopted && st.Standby[0].Profile != tt.stray {
				t.Errorf("state after the watcher: %+v", st)
			}
			if n, d := f.holders(t); n != 1 {
				t.Errorf("%d holders: %s", n, d)
			}
			// And the switch back to the adopted one is a wake.
			evs, err := f.switchTo(t, tt.stray)
			if err != nil {
				t.Fatalf("switch to the adopted %s: %v\n%s", tt.stray, err, describe(evs))
			}
			want := "wake ready verify wake_check"
			if !adopted {
				want = "configure start ready verify wake_check"
			}
			if got := strings.Join(stepsOf(evs), " "); !strings.HasSuffix(got, want) {
				t.Errorf("switch to %s afterwards: steps %q, want them to end %q", tt.stray, got, want)
			}
		})
	}
}

// TestWatcherRestoresAnActiveBackendPutToSleep: a hand /sleep on the
// active vLLM (either level) is found by the watcher, which wakes it with a
// switch that verifies the wake; meanwhile the status is not "active".
func TestWatcherRestoresAnActiveBackendPutToSleep(t *testing.T) {
	for _, level := range []int{1, 2} {
		t.Run(fmt.Sprint("level", level), func(t *testing.T) {
			f := newProcFixtureYAML(t, standbyYAML(t))
			awaitReconciled(t, f.sup)
			if evs, err := f.switchTo(t, "coder"); err != nil {
				t.Fatalf("switch to coder: %v\n%s", err, describe(evs))
			}
			since := f.sup.LastSeq()
			port := f.cfg.Profiles["coder"].Port
			resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/sleep?level=%d", port, level), "", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			slept := time.Now()
			d, evs := awaitDriftSwitch(t, f.sup, since, driftAsleep, "restore")
			if got := strings.Join(stepsOf(evs), " "); got != "wake ready verify wake_check" {
				t.Errorf("restore steps = %q", got)
			}
			t.Logf("hand sleep level %d → found %s later, serving again after %s", level,
				d.Time.Sub(slept).Round(time.Millisecond), evs[len(evs)-1].Time.Sub(slept).Round(time.Millisecond))
			if st := f.sup.State(); st.Phase != api.PhaseActive || st.Profile != "coder" {
				t.Errorf("state after the restore: %+v", st)
			}
			if asleep := f.sup.engineSleeping(context.Background(), f.cfg.Profiles["coder"]); asleep {
				t.Error("coder still asleep after the restore")
			}
			if by, _, _, unresolved := f.sup.Drift(); by[driftAsleep] != 1 || unresolved != "" {
				t.Errorf("Drift = %v, unresolved %q", by, unresolved)
			}
			rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Watcher: f.sup}).Run(context.Background())
			if c, _ := checkByID(rep, "backend.drift", ""); c.Severity != units.SeverityWarn || !strings.Contains(c.Message, "asleep=1") {
				t.Errorf("doctor backend.drift = %s: %s", c.Severity, c.Message)
			}
		})
	}
}

// TestWatcherUnloadsAHandLoadedOllama: a hand /api/generate loads the
// model into the Ollama in standby while the vLLM serves; the watcher
// unloads it again.
func TestWatcherUnloadsAHandLoadedOllama(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	awaitReconciled(t, f.sup)
	for _, p := range []string{"llama", "coder"} {
		if evs, err := f.switchTo(t, p); err != nil {
			t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
		}
	}
	since := f.sup.LastSeq()
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/api/generate", f.cfg.Profiles["llama"].Port), "application/json",
		strings.NewReader(`{"model":"llama3.1:8b","prompt":"hi","stream":false}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e := awaitEvent(t, f.sup, since, func(e api.Event) bool { return e.Kind == "exclusion" })
	if !strings.Contains(e.Message, "put back into standby") {
		t.Errorf("exclusion: %q", e.Message)
	}
	testkit.Eventually(t, 10*time.Second, func() bool { return f.holdersNow() == 1 }, "one holder again")
	if n, d := f.holders(t); n != 1 {
		t.Errorf("%d holders: %s", n, d)
	}
}

// TestWatcherUnloadsAForeignOllamaModel: a hand /api/generate with another
// model into the active Ollama is found: the other model is unloaded and,
// when loading it pushed the profile's model out, the profile's is loaded
// again by a verified restore; the profile ends active with its model.
func TestWatcherUnloadsAForeignOllamaModel(t *testing.T) {
	base := standbyYAML(t)
	f := newProcFixtureYAML(t, func(bin, state string) string {
		return strings.Replace(base(bin, state), "simulate, ollama,", "simulate, ollama, --model, qwen2.5:0.5b,", 1)
	})
	awaitReconciled(t, f.sup)
	if evs, err := f.switchTo(t, "llama"); err != nil {
		t.Fatalf("switch to llama: %v\n%s", err, describe(evs))
	}
	since := f.sup.LastSeq()
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/api/generate", f.cfg.Profiles["llama"].Port), "application/json",
		strings.NewReader(`{"model":"qwen2.5:0.5b","prompt":"hi","stream":false}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("hand load of another model: %s", resp.Status)
	}
	e := awaitEvent(t, f.sup, since, func(e api.Event) bool { return e.Kind == "drift" })
	t.Logf("drift: %s %q", e.Status, e.Message)
	ok := testkit.Poll(30*time.Second, func() bool {
		st := f.sup.State()
		if st.Phase != api.PhaseActive || st.Step != "" || st.Profile != "llama" {
			return false
		}
		o := f.sup.engines["ollama"](*f.cfg.Profiles["llama"], f.sup.client, fmt.Sprintf("http://127.0.0.1:%d", f.cfg.Profiles["llama"].Port))
		others, err := o.(interface {
			Foreign(context.Context) ([]string, error)
		}).Foreign(context.Background())
		return err == nil && len(others) == 0 && !f.sup.engineSleeping(context.Background(), f.cfg.Profiles["llama"])
	})
	if !ok {
		_, evs, cancel := f.sup.Subscribe(since)
		cancel()
		t.Fatalf("llama not back to its own model alone: %+v%s", f.sup.State(), describe(evs))
	}
	by, _, _, unresolved := f.sup.Drift()
	t.Logf("drift by kind: %v", by)
	if by[driftForeignModel]+by[driftAsleep] == 0 || unresolved != "" {
		t.Errorf("Drift = %v, unresolved %q", by, unresolved)
	}
}

// TestVerifyCatchesAHandSleepAndWake: a hand level-2 sleep then wake_up of
// the active vLLM, with no watcher look in between (the looks are an hour
// apart), leaves it saying it is awake with its weights discarded; the
// periodic verify's known prompt fails, a drift event (verify_failed)
// comes first, then a switch that checks it again, counts the failed wake
// check, and starts it cold, after which it answers. Before the hand
// action the verify passes without an event.
func TestVerifyCatchesAHandSleepAndWake(t *testing.T) {
	f := newProcFixtureYAML(t, func(bin, state string) string {
		y := standbyYAML(t)(bin, state)
		return strings.Replace(y, "  standby_watch_interval: 100ms\n", "  standby_watch_interval: 1h\n  verify_interval: 20ms\n", 1)
	})
	awaitReconciled(t, f.sup)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch to coder: %v\n%s", err, describe(evs))
	}
	// Healthy: a verify passes (the verified time moves on) and says nothing.
	f.sup.mu.Lock()
	after := f.sup.watch.verified.at
	f.sup.mu.Unlock()
	if !testkit.Poll(30*time.Second, func() bool {
		f.sup.mu.Lock()
		defer f.sup.mu.Unlock()
		return f.sup.watch.verified.at.After(after)
	}) {
		t.Fatal("no verify passed on the healthy backend")
	}
	if by, _, _, _ := f.sup.Drift(); len(by) != 0 {
		t.Fatalf("drift on a healthy backend: %v", by)
	}
	since := f.sup.LastSeq()
	base := fmt.Sprintf("http://127.0.0.1:%d", f.cfg.Profiles["coder"].Port)
	for _, path := range []string{"/sleep?level=2", "/wake_up"} {
		resp, err := http.Post(base+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	d, evs := awaitDriftSwitch(t, f.sup, since, driftVerifyFailed, "recheck")
	// Order: the finding, then the switch; its wake check fails once (not
	// cold), then the cold start's passes.
	if d.Seq >= evs[0].Seq {
		t.Errorf("the drift event (seq %d) came after the switch's first (seq %d)", d.Seq, evs[0].Seq)
	}
	if got, want := recheckOrder(evs), "switch:started wake_check:failed:cold=false switch:done"; got != want {
		t.Errorf("order = %q, want %q%s", got, want, describe(evs))
	}
	if got := strings.Join(stepsOf(evs), " "); got != "ready verify vram_release configure start ready verify wake_check" {
		t.Errorf("recheck steps = %q", got)
	}
	if by, _, _, unresolved := f.sup.Drift(); by[driftVerifyFailed] != 1 || len(by) != 1 || unresolved != "" {
		t.Errorf("Drift = %v, unresolved %q", by, unresolved)
	}
	if by, _, _ := f.sup.WakeFailures(); sum(by) != 1 {
		t.Errorf("WakeFailures = %v, want one", by)
	}
	if st := f.sup.State(); st.Phase != api.PhaseActive || st.Profile != "coder" {
		t.Errorf("state after the restart: %+v", st)
	}
	// It answers again.
	body := `{"model":"qwen3-coder","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("chat after the cold restart: %d", resp.StatusCode)
	}
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Watcher: f.sup}).Run(context.Background())
	if c, _ := checkByID(rep, "backend.drift", ""); c.Severity != units.SeverityWarn || !strings.Contains(c.Message, "verify_failed=1") {
		t.Errorf("doctor backend.drift = %s: %s", c.Severity, c.Message)
	}
}

// recheckOrder is the order of a recheck's findings, switch and wake
// checks in evs, one word each: drift:KIND, switch:STATUS,
// wake_check:STATUS:cold=BOOL.
func recheckOrder(evs []api.Event) string {
	var order []string
	for _, ev := range evs {
		switch {
		case ev.Kind == api.EventDrift:
			order = append(order, fmt.Sprintf("drift:%v", ev.Detail["drift"]))
		case ev.Kind == api.EventSwitch && ev.Status != api.StatusInfo:
			order = append(order, "switch:"+string(ev.Status))
		case ev.Kind == api.EventWakeCheck:
			order = append(order, fmt.Sprintf("wake_check:%s:cold=%v", ev.Status, ev.Detail["cold"]))
		}
	}
	return strings.Join(order, " ")
}

// awaitDriftSwitch waits for the watcher's drift event of kind, then for
// the switch it started to end done, and returns both (what names the
// switch in failures).
func awaitDriftSwitch(t *testing.T, sup *Supervisor, since uint64, kind, what string) (api.Event, []api.Event) {
	t.Helper()
	d := awaitEvent(t, sup, since, func(e api.Event) bool { return e.Kind == "drift" })
	if d.Detail["drift"] != kind || d.Status != "done" {
		t.Fatalf("drift event: %s %q %v", d.Status, d.Message, d.Detail)
	}
	id, _ := d.Detail["switch_id"].(string)
	evs := collect(t, sup, since, id, 60*time.Second)
	if last := evs[len(evs)-1]; last.Kind != "switch" || last.Status != "done" {
		t.Fatalf("%s switch: %s", what, describe(evs))
	}
	return d, evs
}
