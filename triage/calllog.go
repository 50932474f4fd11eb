package triage

import (
	"fmt"
	"slices"

	"gpuhost/triage/llm"
)

// A mail's paid calls (classification, transcription) are recorded in its
// inflight marker around each call: a record marked started is written
// before the request leaves, and the call's result and cost are written
// as soon as it returns, before anything uses them. After a crash the
// restarted worker reuses every finished call's result instead of paying
// for it again; a call that was started but never finished (the process
// died while it ran, so its reply was lost) is made again and counted as
// a repeat in the tally, so the model's bill and the tally agree.

// Call kinds in a CallRecord.
const (
	callClassification = "classification"
	callTranscription  = "transcription"
)

// CallRecord is one paid call of an inflight mail.
type CallRecord struct {
	Kind string `json:"kind"`
	// Part tells the calls of one kind apart: the attachment's index and
	// name for a transcription, "" for the classification.
	Part string `json:"part,omitempty"`
	// Done is false while the call runs: a record left so by a crash is a
	// call whose result was lost.
	Done   bool        `json:"done"`
	Usages []CallUsage `json:"usages,omitempty"`
	// Cost is the priced Usages, for a reader of the checkpoint.
	Cost float64 `json:"cost,omitempty"`

	// The result, as the pipeline uses it.
	Classification *llm.Classification `json:"classification,omitempty"`
	Unclassified   string              `json:"unclassified,omitempty"` // reason: the reply stayed invalid
	Transcript     string              `json:"transcript,omitempty"`
	Failed         string              `json:"failed,omitempty"` // a transcription that failed (its note)
}

// CallUsage is a localUsage as the checkpoint keeps it.
type CallUsage struct {
	llm.Usage
	Local bool    `json:"local,omitempty"`
	Watts float64 `json:"watts,omitempty"`
	Power bool    `json:"power,omitempty"`
}

func toCallUsages(us []localUsage) []CallUsage {
	out := make([]CallUsage, 0, len(us))
	for _, u := range us {
		out = append(out, CallUsage(u))
	}
	return out
}

func fromCallUsages(us []CallUsage) []localUsage {
	out := make([]localUsage, 0, len(us))
	for _, u := range us {
		out = append(out, localUsage(u))
	}
	return out
}

// callLog writes a mail's call records into the checkpoint. A nil
// *callLog (a hand-run mail, which never writes the checkpoint) records
// nothing and finds nothing. Callers hold w.mu.
type callLog struct {
	w   *Worker
	key string
	uid uint32
	// repeats are the calls of this mail that a crash interrupted and
	// that were made again in this run.
	repeats int
}

// done returns the finished record of the call (nil: not made yet).
func (l *callLog) done(kind, part string) *CallRecord {
	if l == nil {
		return nil
	}
	in := l.w.st.Inflight
	if in == nil || in.Key != l.key {
		return nil
	}
	for i := range in.Calls {
		if c := &in.Calls[i]; c.Kind == kind && c.Part == part && c.Done {
			cp := *c
			return &cp
		}
	}
	return nil
}

// start records that the call is about to be made; it must be on disk
// before the request leaves. A started record of the same call left by an
// earlier run is a call whose result a crash lost: it is counted as a
// repeat (in the mail's cost and the day's tally) and replaced.
func (l *callLog) start(kind, part string) error {
	if l == nil {
		return nil
	}
	st := l.w.st.clone()
	if st.Inflight == nil || st.Inflight.Key != l.key {
		st.Inflight = &Inflight{UID: l.uid, Key: l.key, Since: l.w.o.Clock.Now()}
	}
	in := st.Inflight
	if i := slices.IndexFunc(in.Calls, func(c CallRecord) bool { return c.Kind == kind && c.Part == part }); i >= 0 {
		if !in.Calls[i].Done {
			l.repeats++
			st.Costs = addDayRepeat(st.Costs, l.w.o.Clock.Now(), l.w.o.Prices.Currency)
			l.w.log.Warn("triage: a call for this mail was interrupted by a crash before its result was recorded; making it again (counted as a repeat in the tally)",
				"key", l.key, "kind", kind, "part", part)
		}
		in.Calls = slices.Delete(in.Calls, i, i+1)
	}
	in.Calls = append(in.Calls, CallRecord{Kind: kind, Part: part})
	return l.w.save(st)
}

// finish records the call's result and cost; the pipeline uses the result
// only after this returns nil.
func (l *callLog) finish(rec CallRecord, usages []localUsage) error {
	if l == nil {
		return nil
	}
	rec.Done = true
	rec.Usages = toCallUsages(usages)
	rec.Cost = l.w.price(usages).Total
	st := l.w.st.clone()
	if st.Inflight == nil || st.Inflight.Key != l.key {
		return fmt.Errorf("triage: recording a %s call of %s: the mail is not in flight", rec.Kind, l.key)
	}
	in := st.Inflight
	if i := slices.IndexFunc(in.Calls, func(c CallRecord) bool { return c.Kind == rec.Kind && c.Part == rec.Part }); i >= 0 {
		in.Calls[i] = rec
	} else {
		in.Calls = append(in.Calls, rec)
	}
	return l.w.save(st)
}

// abandon drops the started record of a call that failed without a result
// in this run (the endpoint refused it, ctx ended), so that a later run
// does not count it as a repeat. Best effort: if the write fails, a later
// run counts one repeat too many, and its log line says why.
func (l *callLog) abandon(kind, part string) {
	if l == nil {
		return
	}
	st := l.w.st.clone()
	if st.Inflight == nil || st.Inflight.Key != l.key {
		return
	}
	in := st.Inflight
	i := slices.IndexFunc(in.Calls, func(c CallRecord) bool { return c.Kind == kind && c.Part == part && !c.Done })
	if i < 0 {
		return
	}
	in.Calls = slices.Delete(in.Calls, i, i+1)
	if err := l.w.save(st); err != nil {
		l.w.log.Warn("triage: could not drop the record of a failed call", "key", l.key, "kind", kind, "err", err)
	}
}
