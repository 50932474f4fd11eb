// Package testbin builds the real gpuhost binary once per test process and
// writes configs whose backends are its simulator, for tests in any package
// that need real backends (processes, HTTP, units).
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	once     sync.Once
	built    string
	buildErr error
)

// Binary returns the path of a freshly built gpuhost binary (built once).
// It lives in its own temp directory, which callers that boot a private
// systemd must keep visible inside it.
func Binary(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		dir, err := os.MkdirTemp("", "gpuhost-bin-")
		if err != nil {
			buildErr = err
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
		built = filepath.Join(dir, "gpuhost")
		cmd := exec.Command("go", "build", "-o", built, ".")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build gpuhost: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// ConfigYAML is a gpuhost config whose backends are the simulator in bin.
// runner is "process" or "systemd"; profiles: coder (vLLM, known-good
// flags, load time vllmLoad), coder-greedy (fails doctor: 0.96) and llama
// (Ollama, 6200 MiB). The backends run as root: the private systemd of the
// tests has no gpuhost-backend user.
func ConfigYAML(bin, state, runner, socket string, vllmPort, ollamaPort int, vllmLoad string) string {
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
    user: root
  ollama:
    exec: [%[1]s, simulate, ollama, --sim-dir, %[2]s/simgpu]
    simulated: true
    user: root
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
