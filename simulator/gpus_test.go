package simulator

import (
	"testing"

	"gpuhost/nvml"
)

func TestSimGPUsOf(t *testing.T) {
	tests := []struct{ visible, want string }{
		{"", ""},
		{nvml.SimUUIDFor(0), ""},
		{nvml.SimUUIDFor(1), "1"},
		{nvml.SimUUIDFor(0) + "," + nvml.SimUUIDFor(1), "0,1"},
		{"1", "1"},
		{"GPU-deadbeef-real-card", ""},
	}
	for _, tt := range tests {
		if got := simGPUsOf(tt.visible); got != tt.want {
			t.Errorf("simGPUsOf(%q) = %q; want %q", tt.visible, got, tt.want)
		}
	}
}
