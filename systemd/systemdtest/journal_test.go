package systemdtest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestOverlaps(t *testing.T) {
	ev := func(seq uint64, unit string, kind UnitEventKind) UnitEvent {
		return UnitEvent{Seq: seq, Unit: unit, Kind: kind}
	}
	tests := []struct {
		name       string
		events     []UnitEvent
		violations int
		starts     int
	}{
		{"empty", nil, 0, 0},
		{"stop finished before the other start", []UnitEvent{
			ev(1, "a", UnitStarting), ev(2, "a", UnitStarted), ev(3, "a", UnitStopping), ev(4, "a", UnitSucceeded),
			ev(5, "a", UnitStopped), ev(6, "b", UnitStarting), ev(7, "b", UnitStarted),
		}, 0, 2},
		{"simple unit logs only Started", []UnitEvent{
			ev(1, "a", UnitStarted), ev(2, "a", UnitStopped), ev(3, "b", UnitStarted),
		}, 0, 2},
		{"start while the other is stopping", []UnitEvent{
			ev(1, "a", UnitStarted), ev(2, "a", UnitStopping), ev(3, "b", UnitStarting), ev(4, "a", UnitStopped),
		}, 1, 2},
		{"start while the other is starting", []UnitEvent{
			ev(1, "a", UnitStarting), ev(2, "b", UnitStarting),
		}, 1, 2},
		{"crash ends the run", []UnitEvent{
			ev(1, "a", UnitStarted), ev(2, "a", UnitFailed), ev(3, "b", UnitStarted),
		}, 0, 2},
		{"failed start ends the run", []UnitEvent{
			ev(1, "a", UnitStarting), ev(2, "a", UnitStartFailed), ev(3, "b", UnitStarting),
		}, 0, 2},
		{"restart of the same unit", []UnitEvent{
			ev(1, "a", UnitStarted), ev(2, "a", UnitFailed), ev(3, "a", UnitStarting), ev(4, "a", UnitStarted),
		}, 0, 2},
		{"stopping alone ends nothing", []UnitEvent{
			ev(1, "a", UnitStarted), ev(2, "a", UnitStopping), ev(3, "b", UnitStarted), ev(4, "c", UnitStarted),
		}, 2, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, n := Overlaps(tt.events)
			if len(v) != tt.violations || n != tt.starts {
				t.Errorf("Overlaps = %d violations %q, %d starts; want %d, %d", len(v), v, n, tt.violations, tt.starts)
			}
		})
	}
}

func TestParseUnitEvents(t *testing.T) {
	in := `{"__CURSOR":"s=7f1e;i=c;b=9a2;m=1f;t=5e;x=3d","MESSAGE_ID":"9d1aaa27d60140bd96365438aad20286","UNIT":"a.service","MESSAGE":"Stopped a.service."}
{"__SEQNUM":"10","MESSAGE_ID":"39f53479d3a045ac8e11786248231fbf","UNIT":"a.service","MESSAGE":"Started a.service."}
{"__SEQNUM":"11","MESSAGE":"a.service: Consumed 1ms CPU time.","UNIT":"a.service"}
{"__SEQNUM":"13","MESSAGE_ID":"7d4958e842da4a758f6c1cdc7b36dcc5","UNIT":"b.service","MESSAGE":[83,116]}
`
	got, err := parseUnitEvents(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []UnitEvent{
		{Seq: 10, Unit: "a.service", Kind: UnitStarted, Message: "Started a.service."},
		{Seq: 12, Unit: "a.service", Kind: UnitStopped, Message: "Stopped a.service."},
		{Seq: 13, Unit: "b.service", Kind: UnitStarting},
	}
	if len(got) != len(want) {
		t.Fatalf("parseUnitEvents = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %v, want %v", i, got[i], want[i])
		}
	}
	if _, err := parseUnitEvents(strings.NewReader(`{"__SEQNUM":"x","MESSAGE_ID":"9d1aaa27d60140bd96365438aad20286"}`)); err == nil {
		t.Error("a bad __SEQNUM was accepted")
	}
	if _, err := parseUnitEvents(strings.NewReader(`{"__CURSOR":"s=1;b=2","MESSAGE_ID":"9d1aaa27d60140bd96365438aad20286"}`)); err == nil {
		t.Error("an entry without a sequence number was accepted")
	}
	if _, err := parseUnitEvents(strings.NewReader(`{`)); err == nil {
		t.Error("broken JSON was accepted")
	}
}

// TestUnitEvents reads PID 1's messages from a real private systemd: units
// that conflict (and order after each other) never overlap, even with a
// slow stop; units that do not conflict do, and Overlaps says so.
func TestUnitEvents(t *testing.T) {
	conflicting := "[Unit]\nConflicts=%[1]s\nAfter=%[1]s\n[Service]\nExecStart=/bin/sleep 1000\nExecStop=/bin/sleep 0.3\n"
	s := Start(t, Options{Units: map[string]string{
		"a.service":       strings.ReplaceAll(conflicting, "%[1]s", "b.service"),
		"b.service":       strings.ReplaceAll(conflicting, "%[1]s", "a.service"),
		"c.service":       "[Service]\nExecStart=/bin/sleep 1000\n",
		"d.service":       "[Service]\nExecStartPre=/bin/true\nExecStart=/bin/sleep 1000\n",
		"oneshot.service": "[Service]\nType=oneshot\nExecStart=/bin/false\n",
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, args := range [][]string{{"start", "a.service"}, {"start", "b.service"}, {"start", "a.service"}, {"start", "c.service"}, {"start", "d.service"}} {
		if out, err := s.Systemctl(ctx, args...); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	}
	_, _ = s.Systemctl(ctx, "start", "oneshot.service") // fails

	// journald receives PID 1's messages asynchronously: poll until done
	// says the awaited events are there (or the test's time is up).
	wait := func(done func([]UnitEvent) bool, units ...string) []UnitEvent {
		t.Helper()
		for {
			evs, err := s.UnitEvents(ctx, units...)
			if err != nil {
				t.Fatal(err)
			}
			if done(evs) || ctx.Err() != nil {
				return evs
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	starts := func(want int) func([]UnitEvent) bool {
		return func(evs []UnitEvent) bool { _, n := Overlaps(evs); return n >= want }
	}
	evs := wait(starts(3), "a.service", "b.service")
	if v, n := Overlaps(evs); len(v) != 0 || n != 3 {
		t.Errorf("conflicting units: %d starts, overlaps %q\n%v", n, v, evs)
	}
	evs = wait(starts(2), "c.service", "d.service")
	if v, n := Overlaps(evs); len(v) != 1 || n != 2 {
		t.Errorf("independent units: %d starts, overlaps %q, want 2 starts and 1 overlap\n%v", n, v, evs)
	}
	// A failing start is a start and an end.
	evs = wait(func(evs []UnitEvent) bool {
		return len(evs) > 0 && evs[len(evs)-1].Kind == UnitStartFailed
	}, "oneshot.service")
	var kinds []UnitEventKind
	for _, ev := range evs {
		kinds = append(kinds, ev.Kind)
	}
	if len(kinds) == 0 || kinds[0] != UnitStarting || kinds[len(kinds)-1] != UnitStartFailed {
		t.Errorf("failing oneshot logged %v, want starting ... start-failed", kinds)
	}
}
