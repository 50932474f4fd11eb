//go:build !cgo

package driver

import (
	"context"
	"errors"
	"gpuhost/nvml"
	"strings"
	"testing"
)

func TestNoCgoStub(t *testing.T) {
	n, err := Open()
	if n != nil || !errors.Is(err, nvml.ErrUnavailable) || !strings.Contains(err.Error(), "without cgo") {
		t.Fatalf("Open = %v, %v; want nil and nvml.ErrUnavailable saying 'without cgo'", n, err)
	}
	if _, err := n.Snapshot(context.Background()); !errors.Is(err, nvml.ErrUnavailable) {
		t.Fatalf("nvml.Snapshot = %v; want ErrUnavailable", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("Close = %v; want nil", err)
	}
}
