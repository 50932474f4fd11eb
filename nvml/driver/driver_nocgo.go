//go:build !cgo

package driver

import (
	"context"
	"fmt"
	"gpuhost/nvml"
)

// NVML is the real GPU backend. This build has no cgo, so go-nvml cannot be
// linked and every method reports nvml.ErrUnavailable; the API is the same as in
// cgo builds so that callers compile either way and fall back to Sim.
type NVML struct{}

// Open always fails with nvml.ErrUnavailable in a build without cgo.
func Open() (*NVML, error) {
	return nil, fmt.Errorf("open NVML: gpuhost was built without cgo: %w", nvml.ErrUnavailable)
}

// nvml.Snapshot always fails with nvml.ErrUnavailable in a build without cgo.
func (n *NVML) Snapshot(ctx context.Context) (nvml.Snapshot, error) {
	return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: gpuhost was built without cgo: %w", nvml.ErrUnavailable)
}

// Close does nothing in a build without cgo.
func (n *NVML) Close() error { return nil }
