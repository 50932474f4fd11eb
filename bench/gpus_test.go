package bench

import (
	"context"
	"reflect"
	"testing"

	"gpuhost/nvml"
	"gpuhost/units"
)

// The fingerprint records a profile's GPU set and its cards' UUIDs, and
// names the first card of the set; a profile without gpus records none.
func TestFingerprintGPUSet(t *testing.T) {
	snap, err := nvml.NewSim(nvml.SimConfig{Devices: []nvml.SimDevice{{}, {Name: "NVIDIA GeForce RTX 3090", TotalMiB: 24576}}}).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		gpus      units.GPUSet
		wantGPUs  string
		wantUUIDs []string
		wantName  string
	}{
		{"unset", units.GPUSet{}, "", nil, nvml.DefaultSimName},
		{"GPU 1", units.GPUSet{Indices: []int{1}, Given: true}, "[1]", []string{nvml.SimUUIDFor(1)}, "NVIDIA GeForce RTX 3090"},
		{"both", units.GPUSet{Indices: []int{0, 1}, Given: true}, "[0, 1]", []string{nvml.SimUUIDFor(0), nvml.SimUUIDFor(1)}, nvml.DefaultSimName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ru := &runner{o: Options{Profile: &units.Profile{GPUs: tt.gpus},
				GPU: func(context.Context) (nvml.Snapshot, error) { return snap, nil }}, r: &Result{}}
			ru.gpuFacts(context.Background())
			f := ru.r.Fingerprint
			if f.GPUs != tt.wantGPUs || !reflect.DeepEqual(f.GPUUUIDs, tt.wantUUIDs) || f.GPUName != tt.wantName {
				t.Errorf("fingerprint gpus %q %v name %q; want %q %v %q", f.GPUs, f.GPUUUIDs, f.GPUName, tt.wantGPUs, tt.wantUUIDs, tt.wantName)
			}
		})
	}
}
