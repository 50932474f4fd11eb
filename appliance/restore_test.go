package appliance

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// restartRig keeps the backends (the process runner and its children)
// across Supervisors, so a test can "kill" the daemon mid-switch and start
// a new one over what still runs, as systemd keeps backend units across a
// daemon restart.
type restartRig struct {
	cfg     *config.Config
	gpu     GPU
	u       Units
	journal JournalFunc
}

func newRestartRig(t *testing.T, vllmStopDelay string) *restartRig {
	t.Helper()
	bin := gpuhostBinary(t)
	yaml := testConfigYAML(bin, t.TempDir(), "process", "", testkit.FreePort(t), testkit.FreePort(t), "100ms")
	if vllmStopDelay != "" {
		yaml = strings.Replace(yaml, "simulate, vllm,", "simulate, vllm, --stop-delay, "+vllmStopDelay+",", 1)
	}
	cfg, err := config.Parse("test", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	gpu, closeGPU, err := OpenGPU(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, journal, closeUnits, err := OpenUnits(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeUnits(); closeGPU() })
	return &restartRig{cfg: cfg, gpu: gpu, u: u, journal: journal}
}

// start runs a new Supervisor ("the daemon starts") until the test ends or
// the returned stop is called ("kill -9": nothing is cleaned up).
func (r *restartRig) start(t *testing.T, restore bool) (*Supervisor, func()) {
	t.Helper()
	cfg := *r.cfg
	sw := cfg.Switch
	sw.RestoreOnBoot = &restore
	cfg.Switch = sw
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.Default()
	}
	sup := NewSupervisor(&cfg, r.gpu, r.u, r.journal, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sup.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done; sup.Close() }
	t.Cleanup(stop)
	return sup, stop
}

func (r *restartRig) unitState(t *testing.T, unit string) string {
	t.Helper()
	st, err := r.u.Unit(context.Background(), unit)
	if err != nil {
		t.Fatal(err)
	}
	return st.ActiveState
}

func switchAndWait(t *testing.T, sup *Supervisor, profile string) {
	t.Helper()
	since := sup.LastSeq()
	id, done, err := sup.Switch(context.Background(), profile, api.SwitchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(t, sup, since, id, 60*time.Second)
	if err := <-done; err != nil {
		t.Fatalf("switch to %s: %v%s", profile, err, describe(evs))
	}
}

// TestRestartCompletesLastWanted: the daemon dies after accepting a switch
// from coder to llama (state.json names llama), either before its stop
// reached the units or while the old backend was still stopping (a backend
// that takes seconds to stop). Before, the restart took the stopping or
// still-running coder for the active profile and never started llama (the
// box ended idle or on coder); now the restart completes the switch. With
// restore_on_boot off it leaves the units alone and reports the drift.
func TestRestartCompletesLastWanted(t *testing.T) {
	tests := []struct {
		name        string
		stopDelay   string
		stopStarted bool // the killed switch's stop had reached the unit
		restore     bool
	}{
		{"killed before its stop reached the unit", "", false, true},
		{"killed while the old backend is still stopping", "3s", true, true},
		{"restore_on_boot off reports the drift", "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rig := newRestartRig(t, tt.stopDelay)
			vllm := rig.cfg.Backends.VLLM.Unit
			sup1, kill := rig.start(t, false)
			switchAndWait(t, sup1, "coder")
			// The accepted switch to llama: persisted first, as Switch does.
			if err := sup1.writeLastWanted("llama"); err != nil {
				t.Fatal(err)
			}
			if tt.stopStarted {
				go func() { _ = rig.u.Stop(context.Background(), vllm) }()
				deadline := time.Now().Add(10 * time.Second)
				for rig.unitState(t, vllm) != "deactivating" {
					if time.Now().After(deadline) {
						t.Fatalf("%s never deactivating", vllm)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			kill()

			sup2, _ := rig.start(t, tt.restore)
			select {
			case <-sup2.Ready():
			case <-time.After(30 * time.Second):
				t.Fatal("the restarted Supervisor never became ready")
			}
			if !tt.restore {
				st := sup2.State()
				if st.Phase != api.PhaseActive || st.Profile != "coder" {
					t.Fatalf("with restore_on_boot off the state changed: %+v", st)
				}
				if d := WantedDrift(st); !strings.Contains(d, "llama") || !strings.Contains(d, "coder") {
					t.Errorf("WantedDrift = %q, want it to name llama and coder", d)
				}
				bs, err := sup2.backends(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				// The box serves coder while llama is wanted: the doctor
				// fails, naming llama.
				if c := wantedCheck(rig.cfg, bs, nil); c.Severity != units.SeverityFail || !strings.Contains(c.Message, "not serving") || !strings.Contains(c.Message, "llama") {
					t.Errorf("doctor check = %+v, want a failure naming llama", c)
				}
				return
			}
			// Ready means the restore switch has started: never a bare idle.
			if st := sup2.State(); st.Phase != api.PhaseSwitching || st.Target != "llama" {
				t.Fatalf("at ready the state is %+v, want the restore switch to llama under way", st)
			}
			deadline := time.Now().Add(60 * time.Second)
			for {
				st := sup2.State()
				if st.Phase == api.PhaseActive && st.Profile == "llama" && st.Step == "" {
					break
				}
				if st.Phase != api.PhaseSwitching && rig.unitState(t, vllm) == "inactive" && st.Phase != api.PhaseActive {
					t.Fatalf("after the restart the box settled %s without llama: %+v", st.Phase, st)
				}
				if time.Now().After(deadline) {
					t.Fatalf("llama not active 60 s after the restart: %+v", st)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if got := rig.unitState(t, vllm); got != "inactive" {
				t.Errorf("%s is %s after the restore, want inactive", vllm, got)
			}
			if st := sup2.State(); st.LastWanted != "llama" || WantedDrift(st) != "" {
				t.Errorf("state after the restore = %+v", st)
			}
		})
	}
}

// TestSystemdKillDuringSlowStop is the crash of the issue under a real
// systemd: the daemon is killed (SIGKILL) while the old backend takes
// seconds to stop. Before, the restarted daemon took the "deactivating"
// unit for the active one, ended idle with last_wanted set and never
// started the wanted profile; now it completes the switch. It also checks
// that READY=1 (the return of `systemctl start` for Type=notify) comes
// only once the restore switch is under way.
func TestSystemdKillDuringSlowStop(t *testing.T) {
	e := startE2EWith(t, "100ms", t.TempDir(), func(y string) string {
		return strings.Replace(y, "simulate, vllm,", "simulate, vllm, --stop-delay, 4s,", 1)
	}, nil)
	e.switchTo(t, "coder")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := e.client.Switch(ctx, api.SwitchRequest{Profile: "llama"}); err != nil {
		t.Fatal(err)
	}
	vllm := e.cfg.Backends.VLLM.Unit
	for e.isActive(t, vllm) != "deactivating" {
		if ctx.Err() != nil {
			t.Fatalf("%s never deactivating", vllm)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if out, err := e.sd.Systemctl(ctx, "kill", "--kill-whom=main", "--signal=KILL", "gpuhost.service"); err != nil {
		t.Fatalf("kill gpuhost: %v %s", err, out)
	}
	// Start it at once rather than after RestartSec; `systemctl start`
	// returns when the daemon sent READY=1.
	for e.isActive(t, "gpuhost.service") == "active" {
		if ctx.Err() != nil {
			t.Fatal("gpuhost.service survived SIGKILL")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if out, err := e.sd.Systemctl(ctx, "start", "gpuhost.service"); err != nil {
		t.Fatalf("restart gpuhost: %v %s", err, out)
	}
	st, err := e.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State.Phase != api.PhaseSwitching || st.State.Target != "llama" {
		// Unless the old backend already stopped and the switch finished.
		if !(st.State.Phase == api.PhaseActive && st.State.Profile == "llama") {
			t.Errorf("right after READY the state is %+v, want the restore switch to llama under way", st.State)
		}
	}
	final := e.waitState(t, "llama active after the restart", 60*time.Second, func(s api.Status) bool {
		return s.State.Phase == api.PhaseActive && s.State.Profile == "llama" && s.State.Step == "" ||
			s.State.Phase != api.PhaseSwitching && s.State.Step == "" && s.State.Phase != api.PhaseActive
	})
	if final.State.Phase != api.PhaseActive || final.State.Profile != "llama" {
		t.Fatalf("after the restart the box settled %+v, want llama active", final.State)
	}
	if got := e.isActive(t, vllm); got != "inactive" {
		t.Errorf("%s is %s, want inactive", vllm, got)
	}
}
