package gpu

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"gpuhost/appliance/appliancetest"
	"gpuhost/mcp/connector"
	"gpuhost/nvml"
)

// fixtureDaemon is Daemon over a real Supervisor with simulated GPU
// and backends.
type fixtureDaemon struct{ f *appliancetest.Fixture }

func (d fixtureDaemon) Snapshot(ctx context.Context) (nvml.Snapshot, error) {
	return d.f.Sup.Snapshot(ctx)
}

// staticDaemon returns a fixed snapshot or error, for shapes the simulator
// does not produce (no GPU, several processes, unsupported facts, failure).
type staticDaemon struct {
	snap nvml.Snapshot
	err  error
}

func (d staticDaemon) Snapshot(ctx context.Context) (nvml.Snapshot, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nvml.Snapshot{}, errors.New("test: snapshot called without a deadline")
	}
	return d.snap, d.err
}

func build(t *testing.T, d Daemon) map[string]connector.Tool {
	t.Helper()
	tools, err := (&builder{}).Build(connector.Env{Name: "gpu", Daemon: d})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]connector.Tool{}
	for _, tl := range tools {
		a := tl.Def.Annotations
		if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
			t.Fatalf("%s: annotations %+v, want readOnly true and destructive false", tl.Def.Name, a)
		}
		if !strings.HasPrefix(tl.Def.Name, "gpu_") {
			t.Fatalf("tool %q is not prefixed gpu_", tl.Def.Name)
		}
		out[tl.Def.Name] = tl
	}
	if len(out) != 2 || out["gpu_status"].Handler == nil || out["gpu_processes"].Handler == nil {
		t.Fatalf("tools = %v, want gpu_status and gpu_processes", out)
	}
	return out
}

func TestBuildNeedsDaemon(t *testing.T) {
	_, err := (&builder{}).Build(connector.Env{Name: "gpu"})
	if !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Build without daemon: err = %v, want ErrNoDaemon", err)
	}
	// A daemon that cannot read the GPU (another build of the adapter, a
	// test double) disables the connector with what is missing.
	_, err = (&builder{}).Build(connector.Env{Name: "gpu", Daemon: struct{}{}})
	if err == nil || !strings.Contains(err.Error(), "no Snapshot method") {
		t.Fatalf("Build with a daemon lacking Snapshot: err = %v", err)
	}
}

func TestBuildRejectsUnknownKeys(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("source: nvml\n"), &doc); err != nil {
		t.Fatal(err)
	}
	_, err := (&builder{}).Build(connector.Env{Name: "gpu", Config: *doc.Content[0], Daemon: staticDaemon{}})
	if err == nil || !strings.Contains(err.Error(), "source") || !strings.Contains(err.Error(), "mcp.connectors.gpu") {
		t.Fatalf("Build with unknown key: err = %v", err)
	}
}

func TestToolsAgainstRealSupervisor(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	tools := build(t, fixtureDaemon{f})
	ctx := context.Background()

	out, err := tools["gpu_status"].Handler(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := out.(Status)
	if st.Backend != "sim" || st.DriverVersion == "" || st.CUDADriverVersion == "" || len(st.GPUs) != 1 {
		t.Fatalf("status %+v", st)
	}
	g := st.GPUs[0]
	if g.Name == "" || g.MemoryTotalMiB == 0 || g.MemoryUsedMiB == 0 || g.MemoryUsedMiB > g.MemoryTotalMiB || g.BandwidthGBs <= 0 {
		t.Fatalf("gpu %+v: want a named GPU with the coder model's memory in use", g)
	}
	if g.Processes == 0 {
		t.Fatalf("gpu %+v: the active coder backend holds no memory", g)
	}

	out, err = tools["gpu_processes"].Handler(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := out.(Processes)
	if len(ps.Processes) != g.Processes || ps.TotalMiB == 0 {
		t.Fatalf("processes %+v, want %d with memory", ps, g.Processes)
	}
	for _, p := range ps.Processes {
		if p.PID <= 0 || p.UsedMiB == 0 {
			t.Fatalf("process %+v", p)
		}
	}
}

func TestShapes(t *testing.T) {
	at := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	snap := nvml.Snapshot{Backend: "nvml", DriverVersion: "580.65.06", CUDADriverVersion: "13.0", TakenAt: at,
		Devices: []nvml.Device{{Index: 0, Name: "NVIDIA GeForce RTX 4090", MemoryTotalMiB: 24564, MemoryUsedMiB: 20000, MemoryFreeMiB: 4564,
			FactErrors: map[string]string{"power_w": "ERROR_NOT_SUPPORTED"},
			Processes:  []nvml.Process{{PID: 30, UsedMiB: 500, Name: "Xorg"}, {PID: 20, UsedMiB: 19000, Name: "python3"}, {PID: 10, UsedMiB: 500}}}}}
	tools := build(t, staticDaemon{snap: snap})
	out, err := tools["gpu_status"].Handler(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	st := out.(Status)
	if g := st.GPUs[0]; g.MemoryUsedPercent != 81.4 || g.Unavailable["power_w"] == "" || g.Processes != 3 || st.Note != "" {
		t.Fatalf("status %+v", st)
	}
	out, err = tools["gpu_processes"].Handler(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := out.(Processes)
	want := []Process{{0, 20, "python3", 19000}, {0, 10, "(unreadable)", 500}, {0, 30, "Xorg", 500}}
	if len(ps.Processes) != len(want) || ps.TotalMiB != 20000 {
		t.Fatalf("processes %+v", ps)
	}
	for i := range want {
		if ps.Processes[i] != want[i] {
			t.Fatalf("process %d = %+v, want %+v", i, ps.Processes[i], want[i])
		}
	}

	none := build(t, staticDaemon{snap: nvml.Snapshot{Backend: "nvml"}})
	out, err = none["gpu_status"].Handler(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := out.(Status); len(st.GPUs) != 0 || st.Note == "" {
		t.Fatalf("no-GPU status %+v, want an explaining note", st)
	}
}

func TestSnapshotErrorIsActionable(t *testing.T) {
	tools := build(t, staticDaemon{err: nvml.ErrUnavailable})
	for _, name := range []string{"gpu_status", "gpu_processes"} {
		_, err := tools[name].Handler(context.Background(), nil)
		if !errors.Is(err, nvml.ErrUnavailable) || !strings.Contains(err.Error(), "reading the GPU snapshot failed") {
			t.Fatalf("%s: err = %v", name, err)
		}
	}
}
