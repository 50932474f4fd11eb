package units

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/testkit"
	"gpuhost/systemd/systemdtest"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestUnitsUnderRealSystemd proves the core claim of this package on the
// machine's real systemd: the argv gpuhost renders reaches the backend
// process exactly, through EnvFile, `$GPUHOST_ARGS` splitting and
// QuoteExecWord, and Conflicts= (rendered or added by the adopt drop-in)
// stops the other backend.
func TestUnitsUnderRealSystemd(t *testing.T) {
	dir := t.TempDir()
	sd := systemdtest.Start(t, systemdtest.Options{Keep: []string{dir}})
	unitDir := sd.UnitDir
	systemctl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := sd.Systemctl(ctx, args...)
		if err != nil && args[0] != "is-active" {
			t.Fatalf("systemctl %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(out)
	}

	// The "backend" records its argv and environment, then stays up; the
	// sandbox lets it write only dir (its ReadWritePaths=).
	dump := filepath.Join(dir, "dump-argv")
	writeFile(t, dump, "#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" > \""+dir+"/argv-$GPUHOST_PROFILE\"\nenv > \""+dir+"/env-$GPUHOST_PROFILE\"\nexec sleep 300\n")
	if err := os.Chmod(dump, 0o755); err != nil {
		t.Fatal(err)
	}

	v := qwenCoder()
	v.VLLM.ExtraArgs = []string{"--host=127.0.0.1", "--odd=$HOME%n`x;y"}
	v.Sim = SimOpts{LoadTime: "1.5s", PrefillTPS: 2545.5}
	if errs := v.Validate(); errs != nil {
		t.Fatalf("profile: %v", errs)
	}
	o := llamaOllama()
	vu := BackendUnit{Backend: VLLM, Name: "gpuhost-vllm.service", EnvFile: filepath.Join(dir, "vllm.env"),
		Exec:      []string{dump, "100%", "$HOME", `say "hi" \ there`, ";", "tab and ünï"},
		Conflicts: []string{"gpuhost-ollama.service"}, ReadWritePaths: []string{dir}}
	ou := BackendUnit{Backend: Ollama, Name: "gpuhost-ollama.service", EnvFile: filepath.Join(dir, "ollama.env"),
		Exec: []string{dump}, Conflicts: []string{"gpuhost-vllm.service"}, ReadWritePaths: []string{dir}}
	adopted := BackendUnit{Backend: VLLM, Name: "vllm-op.service", Adopt: true, Conflicts: []string{"gpuhost-ollama.service"}}
	for _, u := range []BackendUnit{vu, ou, adopted} {
		if err := u.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, vu.EnvFile, EnvFile(v, true))
	writeFile(t, ou.EnvFile, EnvFile(o, false))
	writeFile(t, filepath.Join(unitDir, vu.Name), RenderBackendUnit(vu))
	writeFile(t, filepath.Join(unitDir, ou.Name), RenderBackendUnit(ou))
	writeFile(t, filepath.Join(unitDir, adopted.Name), "[Service]\nExecStart=/bin/sleep 300\n")
	dropPath, dropIn := RenderAdoptDropIn(adopted)
	writeFile(t, filepath.Join(unitDir, dropPath), dropIn)
	systemctl("daemon-reload")

	wantArgv := func(u BackendUnit, p Profile, simulated bool) string {
		return strings.Join(append(append([]string{}, u.Exec...), BackendArgs(p, simulated)...), "\x00") + "\x00"
	}
	readWhenThere := func(name string) string {
		var b []byte
		testkit.Eventually(t, 15*time.Second, func() bool {
			var err error
			b, err = os.ReadFile(filepath.Join(dir, name))
			return err == nil && len(b) > 0
		}, name)
		return string(b)
	}

	systemctl("start", vu.Name)
	if got, want := readWhenThere("argv-coder"), wantArgv(vu, v, true); got != want {
		t.Errorf("vLLM unit argv:\n got %q\nwant %q", strings.Split(got, "\x00"), strings.Split(want, "\x00"))
	}

	systemctl("start", ou.Name)
	if got, want := readWhenThere("argv-llama"), wantArgv(ou, o, false); got != want {
		t.Errorf("Ollama unit argv:\n got %q\nwant %q", strings.Split(got, "\x00"), strings.Split(want, "\x00"))
	}
	if st := systemctl("is-active", vu.Name); st != "inactive" {
		t.Errorf("after starting %s, %s is %q; Conflicts= should have stopped it", ou.Name, vu.Name, st)
	}
	env := readWhenThere("env-llama")
	for _, kv := range []string{"OLLAMA_HOST=127.0.0.1:11434", "OLLAMA_KEEP_ALIVE=-1", "OLLAMA_CONTEXT_LENGTH=8192", "GPUHOST_PROFILE=llama"} {
		if !strings.Contains(env, kv+"\n") {
			t.Errorf("Ollama environment lacks %s:\n%s", kv, env)
		}
	}

	// The adopt drop-in alone makes the operator's unit exclusive, both ways.
	systemctl("start", adopted.Name)
	if st := systemctl("is-active", ou.Name); st != "inactive" {
		t.Errorf("after starting adopted %s, %s is %q", adopted.Name, ou.Name, st)
	}
	systemctl("start", ou.Name)
	if st := systemctl("is-active", adopted.Name); st != "inactive" {
		t.Errorf("after starting %s, adopted %s is %q", ou.Name, adopted.Name, st)
	}
}
