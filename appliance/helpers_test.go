package appliance

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// gpuhostBinary builds the real gpuhost binary once per test run; backends
// in these tests are its simulator, started as real processes or units.
func gpuhostBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpuhost-bin-")
		if err != nil {
			buildErr = err
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		builtBin = filepath.Join(dir, "gpuhost")
		cmd := exec.Command("go", "build", "-o", builtBin, ".")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build gpuhost: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// freePort asks the kernel for an unused loopback port.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// testConfigYAML is a config whose backends are the gpuhost simulator;
// runner is "process" or "systemd".
func testConfigYAML(bin, state, runner, socket string, vllmPort, ollamaPort int, vllmLoad string) string {
	return fmt.Sprintf(`
listen: 127.0.0.1:0
state_dir: %[2]s
gpu:
  backend: sim
  sim_dir: %[2]s/simgpu
  release_timeout: 20s
systemd:
  runner: %[3]s
  socket: "%[4]s"
backends:
  vllm:
    exec: [%[1]s, simulate, vllm, --sim-dir, %[2]s/simgpu]
    simulated: true
  ollama:
    exec: [%[1]s, simulate, ollama, --sim-dir, %[2]s/simgpu]
    simulated: true
switch:
  ready_timeout: 30s
  stop_timeout: 10s
default_profile: coder
profiles:
  coder:
    backend: vllm
    model: Qwen/Qwen3-Coder-30B-A3B-Instruct
    served_name: qwen3-coder
    port: %[5]d
    vllm: {gpu_memory_utilization: 0.92, max_num_seqs: 32, max_model_len: 32768, enable_auto_tool_choice: true, tool_call_parser: qwen3_xml}
    sim: {load_time: %[7]s, decode_tps: 500}
  coder-greedy:
    backend: vllm
    model: Qwen/Qwen3-Coder-30B-A3B-Instruct
    served_name: qwen3-coder
    port: %[5]d
    vllm: {gpu_memory_utilization: 0.96, max_num_seqs: 32, enable_auto_tool_choice: true, tool_call_parser: qwen3_xml}
    model_params: {total_params_b: 30.5, active_params_b: 3.3, weight_bits: 4, layers: 48, kv_heads: 4, head_dim: 128}
    sim: {load_time: 10ms}
  llama:
    backend: ollama
    model: llama3.1:8b
    port: %[6]d
    sim: {load_time: 50ms, vram_mib: 6200}
`, bin, state, runner, socket, vllmPort, ollamaPort, vllmLoad)
}

// collect gathers the events of one switch until it ends.
func collect(t testing.TB, sup *Supervisor, since uint64, id string, timeout time.Duration) []Event {
	t.Helper()
	ch, backlog, cancel := sup.Subscribe(since)
	defer cancel()
	var out []Event
	seen := map[uint64]bool{}
	handle := func(e Event) bool {
		if seen[e.Seq] || e.SwitchID != id {
			return false
		}
		seen[e.Seq] = true
		out = append(out, e)
		return e.Kind == "switch" && (e.Status == "done" || e.Status == "failed")
	}
	for _, e := range backlog {
		if handle(e) {
			return out
		}
	}
	ctx, cc := context.WithTimeout(context.Background(), timeout)
	defer cc()
	for {
		select {
		case e := <-ch:
			if handle(e) {
				return out
			}
		case <-ctx.Done():
			t.Fatalf("switch %s did not finish within %s; events so far: %s", id, timeout, describe(out))
		}
	}
}

func describe(evs []Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %s %s %s %s", e.Kind, e.Step, e.Status, e.Message)
	}
	return b.String()
}

func stepEvent(evs []Event, step, status string) (Event, bool) {
	for _, e := range evs {
		if e.Kind == "step" && e.Step == step && e.Status == status {
			return e, true
		}
	}
	return Event{}, false
}

func itoa(n int) string { return fmt.Sprint(n) }

// startSleeper starts a process that lives until the test ends.
func startSleeper(t testing.TB) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}
