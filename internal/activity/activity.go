package activity

import (
	"context"
	"log/slog"
	"time"
)

// Options configure New; zero values take the defaults.
type Options struct {
	// LogSize is how many requests are kept (DefaultLogSize).
	LogSize int
	GPU     GPU
	Events  Events
	// Interval and Keep are the history's sampling (DefaultInterval,
	// DefaultKeep).
	Interval time.Duration
	Keep     time.Duration
	Now      func() time.Time
	Log      *slog.Logger
}

// Recorder is the request log and the history together, the history's
// rates fed by the log: what internal/assemble builds once, the proxy records
// into and the panel reads.
type Recorder struct {
	*Log
	*History
}

// New builds a Recorder; call Run to start sampling.
func New(o Options) *Recorder {
	l := NewLog(o.LogSize)
	h := NewHistory(HistoryOptions{GPU: o.GPU, Events: o.Events, Totals: l.Totals,
		Interval: o.Interval, Keep: o.Keep, Now: o.Now, Log: o.Log})
	return &Recorder{Log: l, History: h}
}

// Run samples the history until ctx ends (see History.Run).
func (r *Recorder) Run(ctx context.Context) { r.History.Run(ctx, nil) }
