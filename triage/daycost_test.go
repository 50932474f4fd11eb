package triage

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestAddDayCost(t *testing.T) {
	day0 := time.Date(2026, 11, 30, 23, 30, 0, 0, time.UTC)
	eur := func(v float64) Cost { return Cost{Currency: "EUR", Classification: v, Total: v, EnergyWh: 1} }
	tests := []struct {
		name string
		days []DayCost
		at   time.Time
		c    Cost
		want []DayCost
	}{
		{"first mail opens the day", nil, day0, eur(0.5),
			[]DayCost{{Day: "2026-11-30", Currency: "EUR", Mails: 1, Classification: 0.5, Total: 0.5, EnergyWh: 1}}},
		{"same day adds up",
			[]DayCost{{Day: "2026-11-30", Currency: "EUR", Mails: 1, Classification: 0.5, Total: 0.5, EnergyWh: 1}},
			day0, eur(0.25),
			[]DayCost{{Day: "2026-11-30", Currency: "EUR", Mails: 2, Classification: 0.75, Total: 0.75, EnergyWh: 2}}},
		{"the day is UTC, not the zone of the time",
			nil, time.Date(2026, 12, 1, 0, 30, 0, 0, time.FixedZone("CET", 3600)), eur(1),
			[]DayCost{{Day: "2026-11-30", Currency: "EUR", Mails: 1, Classification: 1, Total: 1, EnergyWh: 1}}},
		{"a new day is appended after the old ones",
			[]DayCost{{Day: "2026-11-29", Currency: "EUR", Mails: 3, Total: 3}},
			day0, eur(1),
			[]DayCost{{Day: "2026-11-29", Currency: "EUR", Mails: 3, Total: 3}, {Day: "2026-11-30", Currency: "EUR", Mails: 1, Classification: 1, Total: 1, EnergyWh: 1}}},
		{"days older than CostDays go",
			[]DayCost{{Day: "2026-10-31", Currency: "EUR", Mails: 9, Total: 9}, {Day: "2026-11-01", Currency: "EUR", Mails: 1, Total: 1}},
			day0, eur(1),
			[]DayCost{{Day: "2026-11-01", Currency: "EUR", Mails: 1, Total: 1}, {Day: "2026-11-30", Currency: "EUR", Mails: 1, Classification: 1, Total: 1, EnergyWh: 1}}},
		{"another currency has its own entry",
			[]DayCost{{Day: "2026-11-30", Currency: "USD", Mails: 1, Total: 2}},
			day0, eur(1),
			[]DayCost{{Day: "2026-11-30", Currency: "USD", Mails: 1, Total: 2}, {Day: "2026-11-30", Currency: "EUR", Mails: 1, Classification: 1, Total: 1, EnergyWh: 1}}},
		{"a clock set back lands in order",
			[]DayCost{{Day: "2026-11-28", Currency: "EUR", Mails: 1, Total: 1}, {Day: "2026-12-01", Currency: "EUR", Mails: 1, Total: 1}},
			day0, eur(1),
			[]DayCost{{Day: "2026-11-28", Currency: "EUR", Mails: 1, Total: 1}, {Day: "2026-11-30", Currency: "EUR", Mails: 1, Classification: 1, Total: 1, EnergyWh: 1}, {Day: "2026-12-01", Currency: "EUR", Mails: 1, Total: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(tt.days)
			got := addDayCost(tt.days, tt.at, tt.c)
			if !slices.Equal(got, tt.want) {
				t.Errorf("addDayCost =\n %+v\nwant\n %+v", got, tt.want)
			}
			if !slices.Equal(tt.days, before) {
				t.Errorf("addDayCost modified its input: %+v", tt.days)
			}
		})
	}
}

func TestAddDayCostIsBounded(t *testing.T) {
	var days []DayCost
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for i := range 100 {
		days = addDayCost(days, at.AddDate(0, 0, i), Cost{Currency: "EUR", Total: 1})
	}
	if len(days) != CostDays || days[len(days)-1].Day != dayOf(at.AddDate(0, 0, 99)) {
		t.Fatalf("after 100 days the tally holds %d days ending %s, want %d ending on the last", len(days), days[len(days)-1].Day, CostDays)
	}
	// Currencies changing every mail still stay bounded.
	for i := range 3 * maxCostEntries {
		days = addDayCost(days, at.AddDate(0, 0, 99), Cost{Currency: string(rune('A' + i%60)), Total: 1})
	}
	if len(days) > maxCostEntries {
		t.Errorf("the tally grew to %d entries, over %d", len(days), maxCostEntries)
	}
}

// TestDayCostCountsEachMailOnce follows the worker's tally through posts,
// a sink that stays down for several polls (the mail is judged once, so
// counted once), a day change, a restart (the tally is read back from the
// checkpoint) and hand runs (counted in memory, never written by them).
func TestDayCostCountsEachMailOnce(t *testing.T) {
	const perMail = 0.002 // fakeClassifier's 1000+100 tokens at 1 and 10 EUR per million
	e := newUnit(t, nil)
	e.src.add(eml("ann@customer.test", "sales@example.com", "one", "x"))
	e.src.add(eml("ann@customer.test", "sales@example.com", "two", "x"))
	if _, err := e.w.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.src.add(eml("ann@customer.test", "sales@example.com", "three", "x"))
	e.b.failPost = errors.New("slack: 503")
	for range 3 {
		e.clock.Advance(time.Minute)
		if _, err := e.w.Once(context.Background()); err == nil {
			t.Fatal("Once succeeded with sink b down")
		}
	}
	e.b.failPost = nil
	if _, err := e.w.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.cls.calls != 3 {
		t.Fatalf("the classifier was called %d times for 3 mails", e.cls.calls)
	}
	check := func(what string, got []DayCost, want ...DayCost) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: tally %+v, want %+v", what, got, want)
		}
		for i := range want {
			if got[i].Day != want[i].Day || got[i].Mails != want[i].Mails || !near(got[i].Total, want[i].Total) || got[i].Currency != "EUR" {
				t.Errorf("%s: day %d = %+v, want %+v", what, i, got[i], want[i])
			}
		}
	}
	first := DayCost{Day: "2026-11-30", Mails: 3, Total: 3 * perMail}
	check("after three mails", e.w.State().Checkpoint.Costs, first)
	check("on disk", readCheckpoint(t, e.w).Costs, first)

	e.clock.Advance(24 * time.Hour)
	e.reopen(t, nil)
	check("after a restart", e.w.State().Checkpoint.Costs, first)
	e.src.add(eml("ann@customer.test", "sales@example.com", "four", "x"))
	if _, err := e.w.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := DayCost{Day: "2026-12-01", Mails: 1, Total: perMail}
	check("next day", e.w.State().Checkpoint.Costs, first, second)

	if _, err := e.w.ProcessUID(context.Background(), 4, true); err != nil {
		t.Fatal(err)
	}
	second.Mails, second.Total = 2, 2*perMail
	check("after a dry run", e.w.State().Checkpoint.Costs, first, second)
	check("a hand run does not write the checkpoint", readCheckpoint(t, e.w).Costs, first, DayCost{Day: "2026-12-01", Mails: 1, Total: perMail})
	// The next automatic write carries the hand run's cost to disk.
	e.src.add(eml("ann@customer.test", "sales@example.com", "five", "x"))
	if _, err := e.w.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	second.Mails, second.Total = 3, 3*perMail
	check("after the next mail", readCheckpoint(t, e.w).Costs, first, second)
}

// TestAlertTimes follows FailingSince, LastAlert and LastAllClear in the
// State through a failure streak, a reminder and the all-clear.
func TestAlertTimes(t *testing.T) {
	e := newUnit(t, func(o *Options) { o.AlertFailures = 2; o.RemindEvery = time.Hour })
	start := e.clock.Now()
	at := func(d time.Duration) time.Time { return start.Add(d) }
	steps := []struct {
		advance             time.Duration
		fail                bool
		since, alert, clear time.Time
		alerting            bool
		failures            int
	}{
		{0, true, at(0), time.Time{}, time.Time{}, false, 1},
		{time.Minute, true, at(0), at(time.Minute), time.Time{}, true, 2},
		{time.Minute, true, at(0), at(time.Minute), time.Time{}, true, 3},
		{time.Hour, true, at(0), at(62 * time.Minute), time.Time{}, true, 4}, // the reminder
		{time.Minute, false, time.Time{}, at(62 * time.Minute), at(63 * time.Minute), false, 0},
		{time.Minute, true, at(64 * time.Minute), at(62 * time.Minute), at(63 * time.Minute), false, 1},
	}
	for i, s := range steps {
		e.clock.Advance(s.advance)
		e.src.fetchErr = nil
		if s.fail {
			e.src.fetchErr = errors.New("imap: connection refused")
		}
		_, _ = e.w.Once(context.Background())
		st := e.w.State()
		if !st.FailingSince.Equal(s.since) || !st.LastAlert.Equal(s.alert) || !st.LastAllClear.Equal(s.clear) ||
			st.Alerting != s.alerting || st.ConsecutiveFailures != s.failures {
			t.Errorf("step %d: since %v alert %v clear %v alerting %v failures %d;\nwant since %v alert %v clear %v alerting %v failures %d",
				i, st.FailingSince, st.LastAlert, st.LastAllClear, st.Alerting, st.ConsecutiveFailures,
				s.since, s.alert, s.clear, s.alerting, s.failures)
		}
	}
}
