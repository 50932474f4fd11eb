package appliance

import (
	"context"
	"errors"
	"strings"
	"testing"

	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/units"
)

// hostGPU is a GPU that also reports simulated host memory.
type hostGPU struct {
	avail uint64
	err   error
}

func (hostGPU) Snapshot(context.Context) (nvml.Snapshot, error) { return nvml.Snapshot{}, nil }
func (h hostGPU) HostMemAvailableMiB(context.Context) (uint64, error) {
	return h.avail, h.err
}

func TestChooseStandby(t *testing.T) {
	coder := &units.Profile{Name: "coder", Backend: units.VLLM, Model: "m", Standby: units.StandbyAuto,
		Params: units.ModelParams{TotalParamsB: 30.5, WeightBits: 4}} // 14.2 GiB of weights
	tests := []struct {
		name    string
		p       *units.Profile
		mode    units.Standby
		gpu     hostGPU
		want    units.Standby
		wantWhy string
	}{
		{"auto, RAM holds the weights", coder, units.StandbyAuto, hostGPU{avail: 61 << 10}, units.StandbySleep1, "sleep level 1: 14.2 GiB of weights, 61.0 GiB available"},
		{"auto, RAM too small with the margin", coder, units.StandbyAuto, hostGPU{avail: 16 << 10}, units.StandbySleep2, "do not fit in 16.0 GiB available"},
		{"sleep1 configured, RAM too small", coder, units.StandbySleep1, hostGPU{avail: 8 << 10}, units.StandbySleep2, "sleep level 2"},
		{"host memory unknown", coder, units.StandbyAuto, hostGPU{err: errors.New("no meminfo")}, units.StandbySleep2, "host memory unknown (no meminfo)"},
		{"sleep2 configured", coder, units.StandbySleep2, hostGPU{avail: 1 << 20}, units.StandbySleep2, "(configured)"},
		{"ollama", &units.Profile{Name: "llama", Backend: units.Ollama, Model: "llama3.1:8b", Standby: units.StandbyAuto}, units.StandbyAuto, hostGPU{}, units.StandbyUnload, "unload llama3.1:8b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := *tt.p
			p.Standby = tt.mode
			s := &Supervisor{cfg: &config.Config{}, gpu: tt.gpu, log: discardLog}
			got, why := s.chooseStandby(context.Background(), &p, 20000)
			if got != tt.want || !strings.Contains(why, tt.wantWhy) {
				t.Errorf("chooseStandby = %s %q, want %s containing %q", got, why, tt.want, tt.wantWhy)
			}
		})
	}
}
