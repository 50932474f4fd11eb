//go:build cgo

package driver

import (
	"context"
	"testing"

	"gpuhost/nvml"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Every pair of devices gets one P2P verdict from nvmlDeviceGetP2PStatus:
// OK only when both the read and the write capability are OK; a failed
// call is unknown, not a failed snapshot; PCI bus ids are read per device.
func TestNVMLP2PStatus(t *testing.T) {
	type answer struct {
		st  gonvml.GpuP2PStatus
		ret gonvml.Return
	}
	ok := answer{gonvml.P2P_STATUS_OK, gonvml.SUCCESS}
	tests := []struct {
		name        string
		read, write answer
		want        string
		wantErr     bool
	}{
		{"both ok", ok, ok, nvml.P2POK, false},
		{"consumer cards", answer{gonvml.P2P_STATUS_GPU_NOT_SUPPORTED, gonvml.SUCCESS}, ok, nvml.P2PGPUNotSupported, false},
		{"write disabled by regkey", ok, answer{gonvml.P2P_STATUS_DISABLED_BY_REGKEY, gonvml.SUCCESS}, nvml.P2PDisabledByRegkey, false},
		{"chipset", answer{gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED, gonvml.SUCCESS}, ok, nvml.P2PChipsetNotSupported, false},
		{"call fails", answer{0, gonvml.ERROR_NOT_SUPPORTED}, ok, nvml.P2PUnknown, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := new4090s(3)
			var calls int
			for _, d := range f.devs {
				d.GetP2PStatusFunc = func(_ gonvml.Device, c gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
					calls++
					if c == gonvml.P2P_CAPS_INDEX_WRITE {
						return tt.write.st, tt.write.ret
					}
					return tt.read.st, tt.read.ret
				}
			}
			snap, err := mustOpen(t, f).Snapshot(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(snap.P2P) != 3 {
				t.Fatalf("P2P = %+v; want the 3 pairs of 3 devices", snap.P2P)
			}
			for _, l := range snap.P2P {
				if l.A >= l.B || l.Status != tt.want || (l.Err != "") != tt.wantErr {
					t.Errorf("pair = %+v; want status %s (error %v)", l, tt.want, tt.wantErr)
				}
			}
			if calls < 3 || calls > 6 {
				t.Errorf("%d P2P calls for 3 pairs; want 3..6", calls)
			}
			for i, d := range snap.Devices {
				if want := []string{"00000000:01:00.0", "00000000:02:00.0", "00000000:03:00.0"}[i]; d.PCIBusID != want {
					t.Errorf("device %d bus id %q; want %q", i, d.PCIBusID, want)
				}
			}
		})
	}
}
