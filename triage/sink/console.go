package sink

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// consoleSeparator ends every post on the console, so that consecutive
// posts in a terminal or a log are told apart at a glance.
var consoleSeparator = strings.Repeat("-", 72)

// Console writes every post as plain text to a writer (standard output in
// the demo, where it stands in for the team chat, and with `gpuhost triage
// run` in a terminal). The text is Text(p), in which every field from a
// mail has had its control characters removed, so a mail cannot send
// terminal escape sequences. It implements Sink and Alerter, not Checker:
// a crash between writing and recording can repeat a post on the console.
type Console struct {
	mu sync.Mutex // one post or alert is written whole, never interleaved
	w  io.Writer
}

var _ Sink = (*Console)(nil)

// NewConsole returns a console sink writing to w (nil: os.Stdout).
func NewConsole(w io.Writer) *Console {
	if w == nil {
		w = os.Stdout
	}
	return &Console{w: w}
}

// Name is "console".
func (c *Console) Name() string { return "console" }

// Post writes Text(p) and a separator line. A write error is returned
// (the worker then retries the mail), since a console that swallows posts
// would be a sink that silently drops mail.
func (c *Console) Post(ctx context.Context, p Post) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("console: post %s not written: %w", p.Key, err)
	}
	if err := c.write(Text(p) + "\n" + consoleSeparator + "\n"); err != nil {
		return fmt.Errorf("console: write post %s: %w", p.Key, err)
	}
	return nil
}

// Alert writes "ALERT: <text>" on one line (control characters removed,
// clipped like a Telegram message).
func (c *Console) Alert(ctx context.Context, text string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("console: alert not written: %w", err)
	}
	if err := c.write("ALERT: " + alertLine(text, TelegramMaxUnits, func(s string) string { return s }) + "\n"); err != nil {
		return fmt.Errorf("console: write alert: %w", err)
	}
	return nil
}

// write is one Write call under the mutex, so concurrent posts and alerts
// never interleave.
func (c *Console) write(s string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := io.WriteString(c.w, s)
	return err
}
