package simulator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/config"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/systemd/systemdtest"
	"gpuhost/units"
)

// TestFencedUnitUnderRealSystemd runs `gpuhost simulate vllm` in the unit
// gpuhost renders, under a private systemd: with PrivateNetwork=yes the
// simulator sees only loopback and, run by systemd, counts itself fenced
// (--network auto). As rendered it starts and answers /health through its
// socket relay; with the offline settings dropped from the unit and the
// environment file, the unit fails and its journal says why. An open unit
// (backends.vllm.network: open) answers through its relay too, which then
// dials the host's loopback.
func TestFencedUnitUnderRealSystemd(t *testing.T) {
	bin := testbin.Binary(t)
	dir := t.TempDir()
	sd := systemdtest.Start(t, systemdtest.Options{Keep: []string{dir, filepath.Dir(bin)}, NetAdmin: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	systemctl := func(args ...string) string {
		out, err := sd.Systemctl(ctx, args...)
		if err != nil && args[0] != "is-active" {
			t.Fatalf("systemctl %s: %v %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(out)
	}
	for _, tt := range []struct {
		name    string
		drop    bool   // take the offline settings out of the unit and the env file
		network string // backends.vllm.network
	}{{"fenced-as-rendered", false, "fenced"}, {"fenced-without-offline", true, "fenced"}, {"open-unit", false, "open"}} {
		t.Run(tt.name, func(t *testing.T) {
			port := testkit.FreePort(t)
			cfg, err := config.Parse("test", []byte(fmt.Sprintf(`
state_dir: %[1]s/%[2]s
gpu: {backend: sim, sim_dir: %[1]s/simgpu}
backends:
  vllm: {unit: %[2]s.service, exec: [%[3]s, simulate, vllm, --sim-dir, %[1]s/simgpu], simulated: true, user: root, read_write_paths: [%[1]s], network: %[5]s}
  ollama: {unit: other.service, exec: [/bin/false]}
profiles:
  tiny:
    backend: vllm
    model: Org/Tiny
    port: %[4]d
    sim: {load_time: 10ms, vram_mib: 1000}
`, dir, tt.name, bin, port, tt.network)))
			if err != nil {
				t.Fatal(err)
			}
			bu := cfg.BackendUnits()[0]
			env := units.EnvFile(*cfg.Profiles["tiny"], true)
			unit := units.RenderBackendUnit(bu)
			if tt.drop {
				unit = dropLines(unit, "Environment=")
				for _, e := range units.OfflineEnv(units.VLLM) {
					env = dropLines(env, e.Name+"=")
				}
			}
			writeFile(t, bu.EnvFile, env)
			writeFile(t, filepath.Join(sd.UnitDir, bu.Name), unit)
			for _, r := range units.RenderProxyUnits(bu) {
				writeFile(t, filepath.Join(sd.UnitDir, r.Name), r.Content)
			}
			systemctl("daemon-reload")
			systemctl("start", units.ProxySocketUnit(bu.Name, port))
			systemctl("start", bu.Name)
			journal := func() string {
				out, _ := sd.Command(ctx, "journalctl", "--no-pager", "-o", "cat", "-u", bu.Name).CombinedOutput()
				return string(out)
			}
			if tt.drop {
				testkit.Eventually(t, 30*time.Second, func() bool { return systemctl("is-active", bu.Name) == "failed" }, bu.Name+" failed")
				j := journal()
				if !strings.Contains(j, "refuses to start") || !strings.Contains(j, "HF_HUB_OFFLINE") || !strings.Contains(j, "status=78/CONFIG") {
					t.Errorf("journal of %s does not say why it failed:\n%s", bu.Name, j)
				}
				t.Logf("journal of %s:\n%s", bu.Name, j)
				return
			}
			testkit.Eventually(t, 30*time.Second, func() bool {
				_, err = sd.Command(ctx, "curl", "-sS", "--fail", "--max-time", "5", "--unix-socket",
					units.ProxySocketPath(bu.Name, port), "http://127.0.0.1/health").CombinedOutput()
				return err == nil
			}, bu.Name+" /health through its socket")
			if st := systemctl("is-active", bu.Name); st != "active" {
				t.Errorf("%s is %q after answering, want active:\n%s", bu.Name, st, journal())
			}
			systemctl("stop", bu.Name)
		})
	}
}

// dropLines removes the lines of text that start with prefix.
func dropLines(text, prefix string) string {
	var keep []string
	for _, l := range strings.SplitAfter(text, "\n") {
		if !strings.HasPrefix(l, prefix) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
