package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/appliance/procunits"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/nvml/driver"
	"gpuhost/systemd"
)

// unavailableGPU stands in when NVML cannot be opened: every snapshot
// returns the reason, so the daemon stays up and the doctor shows why.
type unavailableGPU struct{ err error }

func (u unavailableGPU) Snapshot(context.Context) (nvml.Snapshot, error) {
	return nvml.Snapshot{}, u.err
}

// OpenGPU opens the configured GPU facts source. The error is also returned
// so that callers can report it; the GPU value is usable either way.
func OpenGPU(cfg *config.Config) (GPU, func(), error) {
	if cfg.GPU.Backend == "sim" {
		s := nvml.NewSim(SimConfig(cfg))
		// The simulated backends write their claims here, but their units
		// may only write into it (ReadWritePaths=), not create it.
		var err error
		if merr := os.MkdirAll(cfg.GPU.SimDir, 0o755); merr != nil {
			err = fmt.Errorf("create gpu.sim_dir: %w", merr)
		}
		return s, func() { s.Close() }, err
	}
	n, err := driver.Open()
	if err != nil {
		err = fmt.Errorf("open NVML (gpu.backend: nvml): %w", err)
		return unavailableGPU{err}, func() {}, err
	}
	return n, func() { n.Close() }, nil
}

// SimConfig is the simulated GPU that gpu.backend sim describes.
func SimConfig(cfg *config.Config) nvml.SimConfig {
	sc := nvml.SimConfig{Dir: cfg.GPU.SimDir, P2P: cfg.GPU.Sim.P2P}
	for _, d := range cfg.GPU.Sim.Devices {
		sc.Devices = append(sc.Devices, nvml.SimDevice{Name: d.Name, TotalMiB: d.MemoryMiB})
	}
	return sc
}

// OpenUnits connects to the configured unit runner: systemd over D-Bus (the
// system bus or a private socket), or the demo's process runner.
func OpenUnits(ctx context.Context, cfg *config.Config) (Units, JournalFunc, func(), error) {
	if cfg.Systemd.Runner == "process" {
		r := procunits.New(processSpecs(cfg)...)
		return r, r.Journal, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r.StopAll(ctx)
		}, nil
	}
	ru := &reconnectingUnits{cfg: cfg}
	if _, err := ru.conn(ctx); err != nil {
		return ru, systemd.JournalTail, ru.Close, err
	}
	return ru, systemd.JournalTail, ru.Close, nil
}

// processLogDir is where the process runner writes each unit's output.
func processLogDir(cfg *config.Config) string { return cfg.StateDir + "/logs" }

// processLogPath is the process runner's log file of unit.
func processLogPath(cfg *config.Config, unit string) string {
	return procunits.LogPath(processLogDir(cfg), unit)
}

func processSpecs(cfg *config.Config) []procunits.Spec {
	var specs []procunits.Spec
	for _, bu := range cfg.BackendUnits() {
		specs = append(specs, procunits.Spec{
			Name: bu.Name, Exec: bu.Exec, EnvFile: bu.EnvFile, Conflicts: bu.Conflicts,
			StopTimeout: cfg.Switch.StopTimeout.D(), LogDir: processLogDir(cfg),
		})
	}
	return specs
}

// reconnectingUnits keeps the daemon up while D-Bus is unreachable: every
// call (re)connects on demand and fails with the reason naming the socket,
// and subscriptions survive a systemd restart.
type reconnectingUnits struct {
	cfg *config.Config
	mu  sync.Mutex
	m   *systemd.Manager
}

func (r *reconnectingUnits) conn(ctx context.Context) (*systemd.Manager, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != nil {
		return r.m, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := systemd.Connect(ctx, r.cfg.Systemd.Socket)
	if err != nil {
		return nil, err
	}
	r.m = m
	return m, nil
}

// drop forgets a connection that failed so the next call reconnects.
func (r *reconnectingUnits) drop(m *systemd.Manager, err error) {
	if err != nil && isConnError(err) {
		r.forget(m)
	}
}

// forget closes m and clears it, unless another call already replaced it.
func (r *reconnectingUnits) forget(m *systemd.Manager) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == m {
		r.m = nil
		m.Close()
	}
}

func isConnError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed)
}

func (r *reconnectingUnits) Start(ctx context.Context, unit string) error {
	m, err := r.conn(ctx)
	if err != nil {
		return err
	}
	err = m.Start(ctx, unit)
	r.drop(m, err)
	return err
}

func (r *reconnectingUnits) Stop(ctx context.Context, unit string) error {
	m, err := r.conn(ctx)
	if err != nil {
		return err
	}
	err = m.Stop(ctx, unit)
	r.drop(m, err)
	return err
}

func (r *reconnectingUnits) Unit(ctx context.Context, unit string) (api.UnitStatus, error) {
	m, err := r.conn(ctx)
	if err != nil {
		return api.UnitStatus{}, err
	}
	st, err := m.Unit(ctx, unit)
	r.drop(m, err)
	return st, err
}

// Subscribe forwards events from the current connection and resubscribes
// (after a pause) when it ends before ctx does.
func (r *reconnectingUnits) Subscribe(ctx context.Context, names ...string) (<-chan systemd.UnitEvent, error) {
	out := make(chan systemd.UnitEvent, 64)
	go func() {
		defer close(out)
		failures := 0
		for ctx.Err() == nil {
			m, err := r.conn(ctx)
			var in <-chan systemd.UnitEvent
			if err == nil {
				in, err = m.Subscribe(ctx, names...)
			}
			if err != nil {
				failures++
				logUnreachable(r.cfg.Systemd.Socket, failures, err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(2 * time.Second):
				}
				continue
			}
			for ev := range in {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
			failures = 0
			// The subscription ended without ctx ending: the bus went away.
			r.forget(m)
			// Tell the Supervisor to re-read, since events may have been lost.
			select {
			case out <- systemd.UnitEvent{Unit: names[0], At: time.Now()}:
			default:
			}
		}
	}()
	return out, nil
}

func (r *reconnectingUnits) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != nil {
		r.m.Close()
		r.m = nil
	}
}

// unreachableHintAfter is how many failed attempts to reach systemd pass
// before the log says what that means and how to run without it.
const unreachableHintAfter = 3

// logUnreachable logs a failed attempt to reach systemd: the first few
// each, then once what to do (the daemon keeps retrying: systemd may
// still be starting), then one line a minute instead of every 2 s.
func logUnreachable(socket string, failures int, err error) {
	switch {
	case failures < unreachableHintAfter:
		slog.Warn("systemd unreachable; retrying", "socket", socket, "attempt", failures, "err", err)
	case failures == unreachableHintAfter:
		where := "the system bus (is this a systemd machine, and is D-Bus running?)"
		if socket != "" {
			where = socket + " (systemd.socket in the config)"
		}
		slog.Error("systemd is not reachable at "+where+" after "+strconv.Itoa(failures)+" attempts; "+
			"gpuhost keeps retrying every 2s and cannot switch until it answers. "+
			"Without systemd, `gpuhost demo` runs the backends as its own processes (simulated GPU and backends)",
			"socket", socket, "err", err)
	case failures%30 == 0:
		slog.Warn("systemd still unreachable; retrying", "socket", socket, "attempt", failures, "err", err)
	}
}
