package metrics

import (
	"testing"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/units"
)

// On a simulated 2-card box every GPU has its DCGM series under its own
// gpu and UUID labels, and the memory a backend holds is attributed to its
// GPU, unit and profile.
func TestGPUSeriesPerGPU(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "llama", Hook: func(c *config.Config) {
		c.GPU.Sim.Devices = make([]config.SimGPUDevice, 2)
		c.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
	}})
	fams := serve(t, f).scrape(t)
	for i, wantMin := range []float64{0, 6200} {
		labels := map[string]string{"gpu": []string{"0", "1"}[i], "UUID": nvml.SimUUIDFor(i)}
		used := fams.value(t, "DCGM_FI_DEV_FB_USED", labels)
		if used < wantMin || (wantMin == 0 && used > 1000) {
			t.Errorf("GPU %d DCGM_FI_DEV_FB_USED = %v; want about %v above idle", i, used, wantMin)
		}
	}
	held := fams.value(t, "gpuhost_gpu_memory_held_bytes", map[string]string{"gpu": "1", "UUID": nvml.SimUUIDFor(1), "unit": "gpuhost-ollama.service", "profile": "llama"})
	if held != 6200*(1<<20) {
		t.Errorf("held on GPU 1 = %v; want 6200 MiB", held)
	}
}
