package appliance

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance/procunits"
	"gpuhost/nvml"
	"gpuhost/units"
)

func checkByID(rep api.DoctorReport, id, profile string) (api.DoctorCheck, bool) {
	for _, c := range rep.Checks {
		if c.ID == id && c.Profile == profile {
			return c, true
		}
	}
	return api.DoctorCheck{}, false
}

func TestDriverCheck(t *testing.T) {
	tests := []struct {
		version string
		want    units.Severity
		msg     string
	}{
		{"610.43.02", units.SeverityOK, "≥ 580"},
		{"580.65.06", units.SeverityOK, "≥ 580"},
		{"535.183.01", units.SeverityFail, "older than 580"},
		{"garbage", units.SeverityFail, "cannot read driver version"},
	}
	for _, tt := range tests {
		c := driverCheck(tt.version, "13.0")
		if c.Severity != tt.want || !strings.Contains(c.Message, tt.msg) || c.Value != tt.version {
			t.Errorf("driver %s: %+v", tt.version, c)
		}
		if c.Severity != units.SeverityOK && c.Fix == "" {
			t.Errorf("driver %s: failing check without a fix", tt.version)
		}
	}
}

// TestDoctorChecksPassAndFail drives the unit, GPU and endpoint checks
// through real processes: each check is seen passing and failing.
func TestDoctorChecksPassAndFail(t *testing.T) {
	f := newProcFixture(t, "10ms")
	ctx := context.Background()
	run := func(d *Doctor) api.DoctorReport { return d.Run(ctx) }
	good := func() *Doctor { return &Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units} }

	// NVML unreachable → fail; sim → ok.
	rep := run(&Doctor{Cfg: f.cfg, GPUErr: errors.New("libnvidia-ml.so.1 not found"), Units: f.sup.units})
	if c, _ := checkByID(rep, "gpu.nvml", ""); c.Severity != units.SeverityFail || !strings.Contains(c.Message, "libnvidia-ml") {
		t.Errorf("gpu.nvml without NVML: %+v", c)
	}
	if rep.Exit != 1 {
		t.Errorf("exit %d, want 1 (a check failed)", rep.Exit)
	}
	rep = run(good())
	if c, _ := checkByID(rep, "gpu.nvml", ""); c.Severity != units.SeverityOK || !strings.Contains(c.Message, "RTX 4090") {
		t.Errorf("gpu.nvml with the sim: %+v", c)
	}
	if c, _ := checkByID(rep, "gpu.driver", ""); c.Severity != units.SeverityOK {
		t.Errorf("gpu.driver with the sim: %+v", c)
	}
	// systemd unreachable → fail.
	rep = run(&Doctor{Cfg: f.cfg, GPU: f.gpu, UnitsErr: errors.New("connect to systemd at /run/systemd/private: no such file")})
	if c, _ := checkByID(rep, "units.systemd", ""); c.Severity != units.SeverityFail || !strings.Contains(c.Message, "/run/systemd/private") {
		t.Errorf("units.systemd: %+v", c)
	}

	// Conflicts both ways: ok with the configured runner, fail without.
	if c, _ := checkByID(rep, "units.conflicts", ""); c.ID != "" {
		t.Error("conflicts check must not run without systemd")
	}
	rep = run(good())
	for _, c := range rep.Checks {
		if c.ID == "units.conflicts" && c.Severity != units.SeverityOK {
			t.Errorf("units.conflicts with Conflicts= set: %+v", c)
		}
	}
	noConflicts := processSpecs(f.cfg)
	for i := range noConflicts {
		noConflicts[i].Conflicts = nil
	}
	loose := procunits.New(noConflicts...)
	defer loose.StopAll(ctx)
	rep = run(&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: loose})
	if c, _ := checkByID(rep, "units.conflicts", ""); c.Severity != units.SeverityFail || !strings.Contains(c.Message, "lacks Conflicts=") {
		t.Errorf("units.conflicts without Conflicts=: %+v", c)
	}

	// Endpoint and drift: switch to coder, then check; ok.
	if _, err := f.switchTo(t, "coder"); err != nil {
		t.Fatal(err)
	}
	rep = run(good())
	for _, id := range []string{"units.exclusive", "units.drift", "endpoint.health", "gpu.foreign_processes"} {
		c, ok := checkByID(rep, id, "")
		if !ok {
			c, ok = checkByID(rep, id, "coder")
		}
		if !ok || c.Severity != units.SeverityOK {
			t.Errorf("%s with coder running: %+v (found %v)", id, c, ok)
		}
	}

	// A foreign process holding VRAM → fail.
	sleeper := startSleeper(t)
	if err := nvml.WriteClaim(f.cfg.GPU.SimDir, nvml.Claim{PID: sleeper.Process.Pid, MiB: 512, Name: "python3"}); err != nil {
		t.Fatal(err)
	}
	rep = run(good())
	if c, _ := checkByID(rep, "gpu.foreign_processes", ""); c.Severity != units.SeverityFail || !strings.Contains(c.Message, "python3") {
		t.Errorf("gpu.foreign_processes with a foreign claim: %+v", c)
	}
	_ = nvml.RemoveClaim(f.cfg.GPU.SimDir, sleeper.Process.Pid)

	// Drift: the unit runs with flags that differ from the profile (an
	// operator edited the environment file and restarted the unit by hand).
	restartWithEditedFlags(t, f, "--max-num-seqs 32", "--max-num-seqs 64")
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep = run(good())
		if c, _ := checkByID(rep, "endpoint.health", "coder"); c.Severity == units.SeverityOK {
			break
		}
		if time.Now().After(deadline) {
			lines, _ := f.sup.journal(ctx, f.cfg.Backends.VLLM.Unit, 20)
			t.Fatalf("hand-started vLLM never became healthy: %+v\n%s", rep.Checks, strings.Join(lines, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, _ := checkByID(rep, "units.drift", "coder")
	if c.Severity != units.SeverityWarn || !strings.Contains(c.Message, "max-num-seqs") || !strings.Contains(c.Message, "64") {
		t.Errorf("units.drift after a hand edit: %+v", c)
	}

	// Two active at once (only possible without Conflicts=) → fail; and the
	// Ollama started by hand has not loaded its model → endpoint fails.
	if _, err := f.switchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	if err := f.sup.units.Stop(ctx, f.cfg.Backends.Ollama.Unit); err != nil {
		t.Fatal(err)
	}
	if err := loose.Start(ctx, f.cfg.Backends.VLLM.Unit); err != nil {
		t.Fatal(err)
	}
	if err := loose.Start(ctx, f.cfg.Backends.Ollama.Unit); err != nil {
		t.Fatal(err)
	}
	rep = run(&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: loose})
	if c, _ := checkByID(rep, "units.exclusive", ""); c.Severity != units.SeverityFail || !strings.Contains(c.Message, "more than one backend") {
		t.Errorf("units.exclusive with two active: %+v", c)
	}
	// Which of the two serves is not known: neither is probed.
	if c, _ := checkByID(rep, "endpoint.health", ""); c.Severity != units.SeverityWarn || !strings.Contains(c.Message, "none probed") {
		t.Errorf("endpoint.health with two active: %+v", c)
	}
	if err := loose.Stop(ctx, f.cfg.Backends.VLLM.Unit); err != nil {
		t.Fatal(err)
	}
	rep = run(&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: loose})
	c, _ = checkByID(rep, "endpoint.health", "llama")
	if c.Severity != units.SeverityFail || !strings.Contains(c.Message, "is not serving correctly") {
		t.Errorf("endpoint.health with the model not loaded: %+v", c)
	}
	// The demo's process runner has no journal: the hint names its log file.
	if logFile := f.cfg.StateDir + "/logs/gpuhost-ollama.log"; !strings.Contains(c.Fix, logFile) || strings.Contains(c.Fix, "journalctl") {
		t.Errorf("endpoint.health fix = %q, want the log file %s", c.Fix, logFile)
	}
}

// restartWithEditedFlags edits the vLLM unit's environment file (old → new)
// and restarts the unit behind the Supervisor's back, as an operator
// editing the file by hand would.
func restartWithEditedFlags(t *testing.T, f *procFixture, old, new string) {
	t.Helper()
	ctx := context.Background()
	envPath := f.cfg.EnvFilePath(f.cfg.Backends.VLLM.Unit)
	env, _ := os.ReadFile(envPath)
	edited := strings.Replace(string(env), old, new, 1)
	if edited == string(env) {
		t.Fatalf("env file has no %s: %s", old, env)
	}
	if err := os.WriteFile(envPath, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.sup.units.Stop(ctx, f.cfg.Backends.VLLM.Unit); err != nil {
		t.Fatal(err)
	}
	if err := f.sup.units.Start(ctx, f.cfg.Backends.VLLM.Unit); err != nil {
		t.Fatal(err)
	}
}
