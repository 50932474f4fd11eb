package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/appliance"
	"gpuhost/systemd/systemdtest"
)

// exposureLimits are the highest `systemd-analyze security` exposure
// scores the rendered units may have (0 = locked down, 10 = unprotected).
// gpuhost.service still talks to systemd over D-Bus and reads NVML; the
// backends still reach /dev/nvidia*.
var exposureLimits = map[string]float64{
	"gpuhost.service":        4.5,
	"gpuhost-vllm.service":   7.0,
	"gpuhost-ollama.service": 7.0,
}

var overallRE = regexp.MustCompile(`Overall exposure level for (\S+): (\d+\.\d+) `)

// TestUnitsHardenedUnderRealSystemd renders the units of the shipped example
// config with `gpuhost units render`, loads them into a private systemd and
// has the running manager score them (`systemd-analyze security UNIT`, the
// manager's view, not --offline) and check them (`systemd-analyze verify`).
func TestUnitsHardenedUnderRealSystemd(t *testing.T) {
	dir := t.TempDir()
	// The example config with programs that exist here, so that verify
	// judges the units rather than the missing vLLM and Ollama binaries.
	example := strings.NewReplacer("/opt/vllm/bin/vllm", "/bin/sleep", "/usr/local/bin/ollama", "/bin/sleep").Replace(string(appliance.ExampleConfig))
	cfgPath := filepath.Join(dir, "gpuhost.yaml")
	if err := os.WriteFile(cfgPath, []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := gpuhost(t, "units", "render", "--config", cfgPath, "--binary", binPath, "--dir", filepath.Join(dir, "units"))
	if code != 0 {
		t.Fatalf("units render: exit %d: %s", code, out)
	}
	files := map[string]string{}
	for name := range exposureLimits {
		b, err := os.ReadFile(filepath.Join(dir, "units", name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(b)
	}
	if !strings.Contains(files["gpuhost-vllm.service"], "\nUser=gpuhost-backend\n") {
		t.Errorf("backend unit does not run as the unprivileged default user:\n%s", files["gpuhost-vllm.service"])
	}
	for name, text := range files {
		if strings.Contains(text, "\nPrivateDevices=") || strings.Contains(text, "\nDevicePolicy=") || strings.Contains(text, "\nDeviceAllow=") {
			t.Errorf("%s restricts devices; NVML and CUDA need /dev/nvidia*:\n%s", name, text)
		}
	}

	sd := systemdtest.Start(t, systemdtest.Options{Units: files, Keep: []string{filepath.Dir(binPath)}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := sd.Systemctl(ctx, "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	for name, limit := range exposureLimits {
		cmd := sd.Command(ctx, "systemd-analyze", "security", "--no-pager", name)
		b, err := cmd.CombinedOutput()
		m := overallRE.FindStringSubmatch(string(b))
		if m == nil || m[1] != name {
			t.Fatalf("systemd-analyze security %s: %v\n%s", name, err, b)
		}
		score, _ := strconv.ParseFloat(m[2], 64)
		t.Logf("systemd-analyze security %s: %s", name, m[2])
		if score > limit {
			t.Errorf("%s: exposure %.1f, want at most %.1f\n%s", name, score, limit, b)
		}
		// verify exits 0 on most warnings: any line is a finding.
		v, err := sd.Command(ctx, "systemd-analyze", "verify", "--man=no", "/etc/systemd/system/"+name).CombinedOutput()
		if err != nil || strings.TrimSpace(string(v)) != "" {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, v)
		}
	}
}

// TestUnitsRenderRefusesInjection: `gpuhost units render|install` validate
// the units again before writing them; --binary reaches ExecStart= only
// here, so only this check can refuse it.
func TestUnitsRenderRefusesInjection(t *testing.T) {
	dir := t.TempDir()
	for _, bin := range []string{"/usr/local/bin/gpuhost\nUser=root", "relative/gpuhost"} {
		out, code := gpuhost(t, "units", "render", "--config", "appliance/gpuhost.example.yaml", "--binary", bin, "--dir", dir)
		if code == 0 || !strings.Contains(out, "gpuhost.service: binary") {
			t.Errorf("--binary %q: exit %d, output %q; want a refusal naming the binary", bin, code, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused render wrote %d files", len(entries))
	}
}
