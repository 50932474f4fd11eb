package exitclass

import (
	"errors"
	"fmt"
	"net"
	"testing"
)

// classed is an error type that carries its class by method, as
// config.Error and api.UnreachableError do.
type classed struct{ c Class }

func (e classed) Error() string    { return "classed" }
func (e classed) ExitClass() Class { return e.c }

func TestOf(t *testing.T) {
	_, dialErr := net.Dial("tcp", "127.0.0.1:1")
	if dialErr == nil {
		t.Skip("something listens on 127.0.0.1:1")
	}
	for _, tt := range []struct {
		name string
		err  error
		want Class
	}{
		{"nil", nil, 0},
		{"plain", errors.New("x"), 1},
		{"usage", UsageErr(errors.New("x")), 64},
		{"config wrapped by fmt", fmt.Errorf("load: %w", ConfigErr(errors.New("x"))), 78},
		{"a type's own class", fmt.Errorf("a: %w", classed{69}), 69},
		// The outermost class wins: the code that wrapped last knew more.
		{"usage around unavailable", UsageErr(UnavailableErr(errors.New("x"))), 64},
		{"problem around a refused dial", ProblemErr(dialErr), 1},
		{"a refused dial", fmt.Errorf("get: %w", dialErr), 69},
	} {
		if got := Of(tt.err); got != tt.want {
			t.Errorf("%s: Of = %d, want %d", tt.name, got, tt.want)
		}
	}
	if New(Usage, nil) != nil {
		t.Error("New(Usage, nil) is not nil")
	}
	if Has(errors.New("x")) || !Has(fmt.Errorf("w: %w", ConfigErr(errors.New("x")))) {
		t.Error("Has")
	}
}
