// Package appliancetest runs a real Supervisor for the front-door packages'
// tests: the process runner with gpuhost's simulator as backends (real
// processes, real HTTP, simulated GPU memory), no root needed.
package appliancetest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// Options shape the fixture.
type Options struct {
	// VLLMLoad is the coder profile's simulated load time (default "10ms").
	VLLMLoad string
	// ExtraYAML is appended to the config (top-level keys such as proxy:).
	ExtraYAML string
	// Hook may change the parsed config before the Supervisor starts.
	Hook func(*config.Config)
	// Activate switches to this profile before returning ("" = none).
	Activate string
	// Log, if set, is the Supervisor's logger (default: discarded, or
	// slog.Default() under go test -v).
	Log *slog.Logger
}

// Fixture is a running Supervisor with profiles coder (vLLM, served name
// qwen3-coder), coder-greedy (fails doctor) and llama (Ollama llama3.1:8b).
type Fixture struct {
	Cfg    *config.Config
	Sup    *appliance.Supervisor
	GPU    appliance.GPU
	Units  appliance.Units
	Doctor api.DoctorFunc
	// Journal reads a unit's last log lines (the process runner's log
	// files under Cfg.StateDir/logs), as the Supervisor does.
	Journal appliance.JournalFunc
	Log     *slog.Logger
}

// New starts the fixture; everything stops at the end of the test.
func New(t testing.TB, opts Options) *Fixture {
	t.Helper()
	if opts.VLLMLoad == "" {
		opts.VLLMLoad = "10ms"
	}
	bin := testbin.Binary(t)
	state := t.TempDir()
	yaml := testbin.ConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), opts.VLLMLoad) + "\n" + opts.ExtraYAML
	cfg, err := config.Parse("appliancetest", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	*cfg.Switch.RestoreOnBoot = false
	if opts.Hook != nil {
		opts.Hook(cfg)
	}
	gpu, closeGPU, err := appliance.OpenGPU(cfg)
	if err != nil {
		// As serve does: the GPU value reports the error on every call.
		t.Logf("GPU facts unavailable (the daemon serves anyway): %v", err)
	}
	u, journal, closeUnits, err := appliance.OpenUnits(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.Default()
	}
	if opts.Log != nil {
		log = opts.Log
	}
	sup := appliance.NewSupervisor(cfg, gpu, u, journal, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sup.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		sup.Close()
		closeUnits()
		closeGPU()
	})
	f := &Fixture{Cfg: cfg, Sup: sup, GPU: gpu, Units: u, Journal: journal, Log: log}
	f.Doctor = func(ctx context.Context, profile string) api.DoctorReport {
		return (&appliance.Doctor{Cfg: cfg, GPU: gpu, Units: u, Profile: profile, Gate: sup}).Run(ctx)
	}
	if opts.Activate != "" {
		if _, err := f.SwitchTo(t, opts.Activate); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// SwitchTo runs a switch to completion and returns its events.
func (f *Fixture) SwitchTo(t testing.TB, profile string) ([]api.Event, error) {
	t.Helper()
	since := f.Sup.LastSeq()
	id, done, err := f.Sup.Switch(context.Background(), profile, api.SwitchOptions{})
	if err != nil {
		return nil, err
	}
	ch, backlog, cancel := f.Sup.Subscribe(since)
	defer cancel()
	var evs []api.Event
	for _, e := range backlog {
		if e.SwitchID == id {
			evs = append(evs, e)
		}
	}
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("switch to %s did not finish in 60 s", profile)
	}
	for {
		select {
		case e := <-ch:
			if e.SwitchID == id {
				evs = append(evs, e)
			}
			continue
		default:
		}
		break
	}
	return evs, err
}

// Describe renders events for failure messages.
func Describe(evs []api.Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString("\n  " + string(e.Kind) + " " + e.Step + " " + string(e.Status) + " " + e.Message)
	}
	return b.String()
}

// Fixed is a front-door backend (the proxy's Backend) whose one profile is
// always active and which never switches: for tests of the wire between
// the proxy and a recording HTTP server put where the backend would be,
// which a Supervisor would only get in the way of.
type Fixed struct{ Profile *units.Profile }

// State reports the profile as active.
func (f Fixed) State() api.State {
	return api.State{Phase: api.PhaseActive, Profile: f.Profile.Name, Backend: f.Profile.Backend}
}

// AwaitActive returns the profile at once.
func (f Fixed) AwaitActive(context.Context) (*units.Profile, error) { return f.Profile, nil }

// Switch refuses: a Fixed backend has nothing to switch to.
func (f Fixed) Switch(context.Context, string, api.SwitchOptions) (string, <-chan error, error) {
	return "", nil, errors.New("appliancetest.Fixed does not switch")
}
