package nvml

import (
	"context"
	"os"
	"testing"
)

// A simulated two-card box: every device is reported with its own UUID, PCI
// address and size, a claim counts only on the devices it names, and the
// P2P status of the pair follows SimConfig.P2P.
func TestSimSeveralDevices(t *testing.T) {
	dir := t.TempDir()
	pid := os.Getpid()
	tests := []struct {
		name     string
		gpus     string
		wantUsed [2]uint64
		wantP2P  string
		p2p      bool
	}{
		{name: "old claim is device 0", gpus: "", wantUsed: [2]uint64{18 + 1000, 18}, wantP2P: P2PGPUNotSupported},
		{name: "claim on device 1", gpus: "1", wantUsed: [2]uint64{18, 18 + 1000}, wantP2P: P2PGPUNotSupported},
		{name: "tensor parallel claim on both", gpus: "0,1", wantUsed: [2]uint64{18 + 1000, 18 + 1000}, wantP2P: P2POK, p2p: true},
		{name: "claim on a device not present", gpus: "7", wantUsed: [2]uint64{18, 18}, wantP2P: P2PGPUNotSupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := WriteClaim(dir, Claim{PID: pid, MiB: 1000, Name: "vllm", GPUs: tt.gpus}); err != nil {
				t.Fatal(err)
			}
			s := NewSim(SimConfig{Dir: dir, P2P: tt.p2p, Devices: []SimDevice{{}, {Name: "NVIDIA GeForce RTX 3090", TotalMiB: 24576}}})
			snap, err := s.Snapshot(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(snap.Devices) != 2 {
				t.Fatalf("%d devices; want 2", len(snap.Devices))
			}
			for i, d := range snap.Devices {
				if d.Index != i || d.UUID != SimUUIDFor(i) || d.PCIBusID == "" || d.MemoryUsedMiB != tt.wantUsed[i] {
					t.Errorf("device %d = index %d uuid %s bus %q used %d; want used %d", i, d.Index, d.UUID, d.PCIBusID, d.MemoryUsedMiB, tt.wantUsed[i])
				}
				if back, ok := SimDeviceIndex(d.UUID); !ok || back != i {
					t.Errorf("SimDeviceIndex(%s) = %d, %v; want %d", d.UUID, back, ok, i)
				}
			}
			if snap.Devices[0].UUID != SimUUID || snap.Devices[1].Name != "NVIDIA GeForce RTX 3090" || snap.Devices[1].MemoryTotalMiB != 24576 {
				t.Errorf("devices = %+v", snap.Devices)
			}
			l, ok := snap.P2PBetween(1, 0)
			if !ok || l.Status != tt.wantP2P || len(snap.P2P) != 1 {
				t.Errorf("P2P = %+v; want one pair %s", snap.P2P, tt.wantP2P)
			}
			if missing := snap.P2PMissing([]int{0, 1}); (len(missing) == 0) != tt.p2p {
				t.Errorf("P2PMissing = %+v with p2p %v", missing, tt.p2p)
			}
		})
	}
}

func TestSimDeviceIndexRejects(t *testing.T) {
	for _, u := range []string{"", "GPU-0", "GPU-5a1f4090-0000-4000-8000-00000000000", "GPU-5a1f4090-0000-4000-8000-zzzzzzzzzzzz", "0"} {
		if i, ok := SimDeviceIndex(u); ok {
			t.Errorf("SimDeviceIndex(%q) = %d, true; want false", u, i)
		}
	}
}

func TestClaimGPUs(t *testing.T) {
	tests := []struct {
		in   []int
		want string
	}{{nil, ""}, {[]int{0}, ""}, {[]int{1}, "1"}, {[]int{0, 1}, "0,1"}}
	for _, tt := range tests {
		if got := ClaimGPUs(tt.in); got != tt.want {
			t.Errorf("ClaimGPUs(%v) = %q; want %q", tt.in, got, tt.want)
		}
		c := Claim{GPUs: ClaimGPUs(tt.in)}
		for _, d := range tt.in {
			if !c.On(d) {
				t.Errorf("claim %q not on %d", c.GPUs, d)
			}
		}
	}
}
