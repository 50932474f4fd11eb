//go:build !cgo

package nvml

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestNoCgoStub(t *testing.T) {
	n, err := Open()
	if n != nil || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "without cgo") {
		t.Fatalf("Open = %v, %v; want nil and ErrUnavailable saying 'without cgo'", n, err)
	}
	if _, err := n.Snapshot(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Snapshot = %v; want ErrUnavailable", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("Close = %v; want nil", err)
	}
}
