package appliance

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"gpuhost/api"
)

// eventBus fans events out to subscribers without ever blocking the
// Supervisor: a subscriber that does not keep up loses events (counted).
type eventBus struct {
	log *slog.Logger

	mu      sync.Mutex
	seq     uint64
	ring    []api.Event
	subs    map[chan api.Event]struct{}
	dropped uint64
}

const ringSize = 256

func newEventBus(log *slog.Logger) *eventBus {
	return &eventBus{log: log, subs: map[chan api.Event]struct{}{}}
}

func (b *eventBus) publish(e api.Event) api.Event {
	b.mu.Lock()
	b.seq++
	e.Seq = b.seq
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	b.ring = append(b.ring, e)
	if len(b.ring) > ringSize {
		b.ring = b.ring[len(b.ring)-ringSize:]
	}
	for ch := range b.subs {
		select {
		case ch <- e:
		default:
			b.dropped++
		}
	}
	b.mu.Unlock()

	attrs := []any{"kind", e.Kind, "seq", e.Seq}
	if e.SwitchID != "" {
		attrs = append(attrs, "switch", e.SwitchID)
	}
	if e.Profile != "" {
		attrs = append(attrs, "profile", e.Profile)
	}
	if e.Step != "" {
		attrs = append(attrs, "step", e.Step, "status", e.Status)
	}
	if e.DurationMS > 0 {
		attrs = append(attrs, "duration_ms", e.DurationMS)
	}
	level := slog.LevelInfo
	if e.Status == api.StatusFailed {
		level = slog.LevelError
		if len(e.Journal) > 0 {
			attrs = append(attrs, "journal_lines", len(e.Journal))
		}
	}
	b.log.Log(context.Background(), level, e.Message, attrs...)
	return e
}

// subscribe returns a channel of new events, optionally preceded by the
// buffered events after seq `since` (so a client reconnecting loses nothing
// that is still in the ring), and a cancel function.
func (b *eventBus) subscribe(since uint64) (<-chan api.Event, []api.Event, func()) {
	ch := make(chan api.Event, 128)
	b.mu.Lock()
	var backlog []api.Event
	for _, e := range b.ring {
		if e.Seq > since {
			backlog = append(backlog, e)
		}
	}
	b.subs[ch] = struct{}{}
	b.mu.Unlock()
	return ch, backlog, func() {
		b.mu.Lock()
		delete(b.subs, ch)
		b.mu.Unlock()
	}
}

func (b *eventBus) lastSeq() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq
}
