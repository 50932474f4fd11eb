package panel

import (
	"strings"
	"testing"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/units"
)

// On a box with several GPUs the dashboard has one line per GPU saying
// who holds memory on it; with one GPU it has none.
func TestDashboardShowsEachGPU(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "llama", Hook: func(c *config.Config) {
		c.GPU.Sim.Devices = make([]config.SimGPUDevice, 2)
		c.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
	}}})
	_, body := do(t, ev.client(t), "GET", ev.srv.URL+"/", nil, nil)
	for _, want := range []string{`<li id="gpu-0">GPU 0 NVIDIA GeForce RTX 4090 (GPU-5a1f4090…) 0.0/24.0 GiB: free</li>`,
		`<li id="gpu-1">GPU 1 NVIDIA GeForce RTX 4090 (GPU-5a1f4091…) 6.1/24.0 GiB: llama (gpuhost-ollama.service) 6200 MiB</li>`} {
		if !strings.Contains(body, want) {
			t.Errorf("dashboard lacks %q", want)
		}
	}
	one := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "llama"}})
	if _, body := do(t, one.client(t), "GET", one.srv.URL+"/", nil, nil); strings.Contains(body, `id="gpu-0"`) {
		t.Error("a one-GPU dashboard has per-GPU lines")
	}
}
