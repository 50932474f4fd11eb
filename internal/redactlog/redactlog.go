// Package redactlog is a slog.Handler that passes the message and every
// attribute through a redact function before the record is written, so a
// secret that reaches a log call by mistake (in a URL inside a transport
// error, say) never reaches the journal. The Telegram bot and the MCP
// server both wrap their loggers with it.
package redactlog

import (
	"context"
	"fmt"
	"log/slog"
)

// New wraps inner; redact is called on every string that leaves.
func New(inner slog.Handler, redact func(string) string) slog.Handler {
	return &handler{h: inner, redact: redact}
}

type handler struct {
	h      slog.Handler
	redact func(string) string
}

func (r *handler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, r.redact(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(r.attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r *handler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = r.attr(a)
	}
	return &handler{h: r.h.WithAttrs(clean), redact: r.redact}
}

func (r *handler) WithGroup(name string) slog.Handler {
	return &handler{h: r.h.WithGroup(name), redact: r.redact}
}

// attr redacts strings and, since any value may print a secret (an error,
// a Stringer, a struct), renders every other non-scalar value as a
// redacted string.
func (r *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, r.redact(v.String()))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]any, len(g))
		for i, ga := range g {
			clean[i] = r.attr(ga)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, r.redact(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, r.redact(x.String()))
		default:
			return slog.String(a.Key, r.redact(fmt.Sprintf("%+v", x)))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
