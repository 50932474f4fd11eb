package appliance

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestPollerGaps checks the schedules: the gap grows by half from 2 ms to
// the cap, and an early cap holds it lower while the early stretch lasts.
func TestPollerGaps(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		p    *poller
		want []time.Duration // the gap before each of the next waits
	}{
		{"plain", newPoller(20 * ms), []time.Duration{2 * ms, 3 * ms, 4500 * time.Microsecond, 6750 * time.Microsecond, 10125 * time.Microsecond, 15187500, 20 * ms, 20 * ms}},
		{"early cap in force", newEarlyPoller(20*ms, 4*ms, time.Hour), []time.Duration{2 * ms, 3 * ms, 4 * ms, 4 * ms, 4 * ms}},
		{"early stretch over", newEarlyPoller(20*ms, 4*ms, -time.Second), []time.Duration{2 * ms, 3 * ms, 4500 * time.Microsecond, 6750 * time.Microsecond}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // wait returns at once; only the schedule is looked at
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []time.Duration
			for range tt.want {
				got = append(got, tt.p.next)
				if err := tt.p.wait(ctx); err == nil {
					t.Fatal("wait on a cancelled context returned nil")
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("gaps %v, want %v", got, tt.want)
			}
		})
	}
}
