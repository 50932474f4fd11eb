package triage

import (
	"slices"
	"strings"
	"time"
)

// CostDays is how many days of per-day cost the checkpoint keeps (today
// and the days before it): enough for a month's glance on the panel, small
// enough that the checkpoint, written after every mail, stays a few KiB.
const CostDays = 30

// maxCostEntries caps the tally even if the currency changed every day
// (each currency has its own entry per day).
const maxCostEntries = 2 * CostDays

// DayCost is the AI work of the mails judged on one UTC day, in one
// currency. A mail counts on the day it was judged, once: a mail whose
// post is retried reuses its judged result (and cost) and is not counted
// again; a hand-run mail (`triage mail --uid`, the panel's "run again", dry
// runs included) counts, because the model was paid either way, as in the
// gpuhost_triage_cost_total series.
type DayCost struct {
	// Day is the UTC date, "2006-01-02": UTC, like every time the
	// checkpoint stores, so a tally does not move with the box's zone.
	Day            string  `json:"day"`
	Currency       string  `json:"currency"`
	Mails          int     `json:"mails"`
	Classification float64 `json:"classification"`
	Transcription  float64 `json:"transcription"`
	Energy         float64 `json:"energy"`
	Total          float64 `json:"total"`
	EnergyWh       float64 `json:"energy_wh,omitempty"`
	// Calls are the model and transcription calls of the day's mails;
	// Repeats the calls made again because a crash lost their reply
	// (calllog.go), so Calls + Repeats is what the endpoints were asked.
	Calls   int `json:"calls"`
	Repeats int `json:"repeats,omitempty"`
}

// dayOf is the tally's day of t.
func dayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// addDayCost returns days (oldest first) with one mail's cost c added to
// the entry of at's day, dropping the days more than CostDays-1 before at.
// It does not modify days.
func addDayCost(days []DayCost, at time.Time, c Cost) []DayCost {
	day := dayOf(at)
	oldest := dayOf(at.AddDate(0, 0, -(CostDays - 1)))
	out := make([]DayCost, 0, len(days)+1)
	for _, d := range days {
		if d.Day >= oldest {
			out = append(out, d)
		}
	}
	i := slices.IndexFunc(out, func(d DayCost) bool { return d.Day == day && d.Currency == c.Currency })
	if i < 0 {
		out = append(out, DayCost{Day: day, Currency: c.Currency})
		i = len(out) - 1
	}
	d := &out[i]
	d.Mails++
	d.Calls += c.Calls
	d.Classification += c.Classification
	d.Transcription += c.Transcription
	d.Energy += c.Energy
	d.Total += c.Total
	d.EnergyWh += c.EnergyWh
	// A clock set back can add an older day after a newer one.
	slices.SortStableFunc(out, func(a, b DayCost) int { return strings.Compare(a.Day, b.Day) })
	if over := len(out) - maxCostEntries; over > 0 {
		out = slices.Delete(out, 0, over)
	}
	return out
}

// addDayRepeat returns days with one repeated call counted on at's day.
func addDayRepeat(days []DayCost, at time.Time, currency string) []DayCost {
	out := addDayCost(days, at, Cost{Currency: currency})
	i := slices.IndexFunc(out, func(d DayCost) bool { return d.Day == dayOf(at) && d.Currency == currency })
	out[i].Mails-- // addDayCost counted a mail; a repeat is no mail
	out[i].Repeats++
	return out
}

// countManual adds a hand-run mail's cost to the tally in memory only: a
// hand run never writes the checkpoint (`gpuhost triage mail --uid` runs
// in a process of its own beside the daemon, and a write from its stale
// copy would move the daemon's last UID back). The daemon's next
// checkpoint write carries the sum to disk. Callers hold w.mu.
func (w *Worker) countManual(r *Result) {
	w.st.Costs = addDayCost(w.st.Costs, r.At, r.Cost)
	w.smu.Lock()
	w.status.Checkpoint = w.st.clone()
	w.smu.Unlock()
}
