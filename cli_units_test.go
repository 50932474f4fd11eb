package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/config"
	"gpuhost/systemd/systemdtest"
)

// Exposure limits of `systemd-analyze security` (0 = locked down, 10 =
// unprotected): gpuhost.service still talks to systemd over D-Bus and reads
// NVML; the backends still reach /dev/nvidia*. The backends scored 2.0
// (2.3 as root) before they got a private network, 1.4 (1.7) with it; they
// must never be worse than before.
const (
	daemonExposureLimit  = 4.5
	backendExposureLimit = 2.0
	proxyExposureLimit   = 1.0
)

var overallRE = regexp.MustCompile(`Overall exposure level for (\S+): (\d+\.\d+) `)

// TestUnitsHardenedUnderRealSystemd renders the units of the shipped example
// config with `gpuhost units render` (as shipped, with the backends as
// root, and with a state_dir elsewhere and a port below 1024), loads them
// into a private systemd and has the running manager score them
// (`systemd-analyze security UNIT`, the manager's view, not --offline) and
// check them (`systemd-analyze verify`).
func TestUnitsHardenedUnderRealSystemd(t *testing.T) {
	// The example config with programs that exist here, so that verify
	// judges the units rather than the missing vLLM and Ollama binaries.
	example := strings.NewReplacer("/opt/vllm/bin/vllm", "/bin/sleep", "/usr/local/bin/ollama", "/bin/sleep").Replace(string(config.Example))
	variants := []struct {
		name   string // prefix of the unit names inside the private systemd
		config string
	}{
		{"", example},
		{"root-", strings.ReplaceAll(example, "user: gpuhost-backend", "user: root")},
		{"alt-", strings.Replace(strings.Replace(example, "state_dir: /var/lib/gpuhost", "state_dir: /srv/gpuhost", 1), "listen: 127.0.0.1:8080", "listen: 127.0.0.1:80", 1)},
	}
	files := map[string]string{}
	limits := map[string]float64{}
	dir := t.TempDir()
	for _, v := range variants {
		cfgPath := filepath.Join(dir, v.name+"gpuhost.yaml")
		if err := os.WriteFile(cfgPath, []byte(v.config), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, v.name+"units")
		if o, code := gpuhost(t, "units", "render", "--config", cfgPath, "--binary", binPath, "--dir", out); code != 0 {
			t.Fatalf("units render %s: exit %d: %s", cfgPath, code, o)
		}
		for name, limit := range map[string]float64{"gpuhost.service": daemonExposureLimit,
			"gpuhost-vllm.service": backendExposureLimit, "gpuhost-ollama.service": backendExposureLimit} {
			b, err := os.ReadFile(filepath.Join(out, name))
			if err != nil {
				t.Fatal(err)
			}
			text := string(b)
			if v.name != "" {
				text = strings.NewReplacer("gpuhost-vllm.service", v.name+"gpuhost-vllm.service",
					"gpuhost-ollama.service", v.name+"gpuhost-ollama.service").Replace(text)
			}
			files[v.name+name], limits[v.name+name] = text, limit
		}
		if v.name != "" {
			continue
		}
		// The backends' socket relays (as shipped): scored and verified too.
		for _, name := range []string{"gpuhost-vllm-proxy-8000.socket", "gpuhost-vllm-proxy-8000.service",
			"gpuhost-ollama-proxy-11434.socket", "gpuhost-ollama-proxy-11434.service"} {
			b, err := os.ReadFile(filepath.Join(out, name))
			if err != nil {
				t.Fatalf("units render wrote no %s: %v", name, err)
			}
			files[name], limits[name] = string(b), proxyExposureLimit
		}
	}
	for _, want := range []struct{ unit, line string }{
		{"gpuhost-vllm.service", "User=gpuhost-backend"},
		{"gpuhost-ollama.service", "ReadWritePaths=-/var/lib/gpuhost-backend"},
		{"root-gpuhost-vllm.service", "User=root"},
		{"alt-gpuhost.service", "ReadWritePaths=/etc/systemd/system -/run/systemd/system /srv/gpuhost"},
		{"alt-gpuhost.service", "CapabilityBoundingSet=CAP_SYS_PTRACE CAP_NET_BIND_SERVICE"},
	} {
		if !strings.Contains(files[want.unit], "\n"+want.line+"\n") {
			t.Errorf("%s lacks the line %q:\n%s", want.unit, want.line, files[want.unit])
		}
	}
	for name, text := range files {
		if strings.Contains(name, "-proxy-") {
			continue // the relays touch no GPU: PrivateDevices=yes is right there
		}
		for _, k := range []string{"PrivateDevices=", "DevicePolicy=", "DeviceAllow="} {
			if strings.Contains(text, "\n"+k) {
				t.Errorf("%s sets %s; NVML and CUDA need /dev/nvidia*", name, k)
			}
		}
	}

	sd := systemdtest.Start(t, systemdtest.Options{Units: files, Keep: []string{filepath.Dir(binPath)}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := sd.Systemctl(ctx, "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, ".socket") {
			// security scores services only; a socket is verified below.
			verifyUnit(ctx, t, sd, name)
			continue
		}
		b, err := sd.Command(ctx, "systemd-analyze", "security", "--no-pager", name).CombinedOutput()
		m := overallRE.FindStringSubmatch(string(b))
		if m == nil || m[1] != name {
			t.Fatalf("systemd-analyze security %s: %v\n%s", name, err, b)
		}
		score, _ := strconv.ParseFloat(m[2], 64)
		t.Logf("systemd-analyze security %s: %s", name, m[2])
		if score > limits[name] {
			t.Errorf("%s: exposure %.1f, want at most %.1f\n%s", name, score, limits[name], b)
		}
		verifyUnit(ctx, t, sd, name)
	}
}

// verifyUnit runs `systemd-analyze verify` on one unit inside sd; verify
// exits 0 on most warnings, so any line is a finding.
func verifyUnit(ctx context.Context, t *testing.T, sd *systemdtest.Systemd, name string) {
	t.Helper()
	v, err := sd.Command(ctx, "systemd-analyze", "verify", "--man=no", "/etc/systemd/system/"+name).CombinedOutput()
	if err != nil || strings.TrimSpace(string(v)) != "" {
		t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, v)
	}
}

// TestUnitsRenderRefusesInjection: `gpuhost units render|install` validate
// the units again before writing them; --binary reaches ExecStart= only
// here, so only this check can refuse it.
func TestUnitsRenderRefusesInjection(t *testing.T) {
	dir := t.TempDir()
	for _, bin := range []string{"/usr/local/bin/gpuhost\nUser=root", "relative/gpuhost"} {
		out, code := gpuhost(t, "units", "render", "--config", "config/gpuhost.example.yaml", "--binary", bin, "--dir", dir)
		if code == 0 || !strings.Contains(out, "gpuhost.service: binary") {
			t.Errorf("--binary %q: exit %d, output %q; want a refusal naming the binary", bin, code, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused render wrote %d files", len(entries))
	}
}

// TestUnitsRenderExample: --example renders the embedded example config as
// if installed at --config (what `make deb` packages), even where no file
// exists there and whatever a file at that path would say.
func TestUnitsRenderExample(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "gpuhost.yaml") // does not exist
	out, code := gpuhost(t, "units", "render", "--example", "--config", other, "--binary", "/usr/bin/gpuhost")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, w := range []string{"ExecStart=/usr/bin/gpuhost serve --config " + other, "User=gpuhost-backend", "ExecStart=/opt/vllm/bin/vllm $GPUHOST_ARGS"} {
		if !strings.Contains(out, w) {
			t.Errorf("render --example lacks %q:\n%s", w, out)
		}
	}
	// A config at --config is ignored: the example is rendered.
	if err := os.WriteFile(other, []byte("not: [valid"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out2, code := gpuhost(t, "units", "render", "--example", "--config", other, "--binary", "/usr/bin/gpuhost"); code != 0 || out2 != out {
		t.Errorf("render --example with a file at --config: exit %d, output differs: %v", code, out2 != out)
	}
}
