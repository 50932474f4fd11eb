package api

import "testing"

func TestGPULine(t *testing.T) {
	tests := []struct {
		g    GPUStatus
		want string
	}{
		{GPUStatus{Index: 0, Name: "RTX", UUID: "GPU-abc-def", MemoryUsedMiB: 1024, MemoryTotalMiB: 2048, Holders: []GPUHolder{}},
			"GPU 0 RTX (GPU-abc…) 1.0/2.0 GiB: free"},
		{GPUStatus{Index: 1, Name: "RTX", UUID: "MIG-x", MemoryUsedMiB: 1024, MemoryTotalMiB: 2048, Holders: []GPUHolder{
			{PID: 5, Name: "vllm", UsedMiB: 900, Unit: "gpuhost-vllm.service", Profile: "coder"},
			{PID: 6, Name: "python", UsedMiB: 100}}},
			"GPU 1 RTX (MIG-x) 1.0/2.0 GiB: coder (gpuhost-vllm.service) 900 MiB, pid 6 python (not gpuhost's) 100 MiB"},
	}
	for _, tt := range tests {
		if got := tt.g.Line(); got != tt.want {
			t.Errorf("Line() = %q; want %q", got, tt.want)
		}
	}
}
