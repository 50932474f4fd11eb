//go:build !cgo

package nvml

import (
	"context"
	"fmt"
)

// NVML is the real GPU backend. This build has no cgo, so go-nvml cannot be
// linked and every method reports ErrUnavailable; the API is the same as in
// cgo builds so that callers compile either way and fall back to Sim.
type NVML struct{}

// Open always fails with ErrUnavailable in a build without cgo.
func Open() (*NVML, error) {
	return nil, fmt.Errorf("open NVML: gpuhost was built without cgo: %w", ErrUnavailable)
}

// Snapshot always fails with ErrUnavailable in a build without cgo.
func (n *NVML) Snapshot(ctx context.Context) (Snapshot, error) {
	return Snapshot{}, fmt.Errorf("NVML snapshot: gpuhost was built without cgo: %w", ErrUnavailable)
}

// Close does nothing in a build without cgo.
func (n *NVML) Close() error { return nil }
