package sink

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"

	"gpuhost/internal/testkit"
)

// failWriter fails every write, as a closed standard output does.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, fs.ErrClosed }

func TestConsole(t *testing.T) {
	p := samplePost()
	p.Subject = "\x1b]0;owned\x07Invoice"
	tests := []struct {
		name    string
		w       func(*testkit.SyncBuffer) *Console
		do      func(ctx context.Context, c *Console) error
		cancel  bool
		want    string // the whole output
		wantErr string
	}{
		{
			name: "post: the text and a separator",
			do:   func(ctx context.Context, c *Console) error { return c.Post(ctx, p) },
			want: Text(p) + "\n" + consoleSeparator + "\n",
		},
		{
			name: "alert: one line",
			do: func(ctx context.Context, c *Console) error {
				return c.Alert(ctx, "triage: down\r\nsince now\x1b[2J")
			},
			want: "ALERT: triage: down since now [2J\n",
		},
		{
			name:    "write error is returned",
			w:       func(*testkit.SyncBuffer) *Console { return NewConsole(failWriter{}) },
			do:      func(ctx context.Context, c *Console) error { return c.Post(ctx, p) },
			wantErr: "console: write post " + p.Key + ": file already closed",
		},
		{
			name:    "alert write error is returned",
			w:       func(*testkit.SyncBuffer) *Console { return NewConsole(failWriter{}) },
			do:      func(ctx context.Context, c *Console) error { return c.Alert(ctx, "x") },
			wantErr: "console: write alert",
		},
		{
			name:    "ended context: nothing written",
			do:      func(ctx context.Context, c *Console) error { return c.Post(ctx, p) },
			cancel:  true,
			wantErr: "context canceled",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf testkit.SyncBuffer
			c := NewConsole(&buf)
			if tc.w != nil {
				c = tc.w(&buf)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if tc.cancel {
				cancel()
			}
			defer cancel()
			err := tc.do(ctx, c)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("err = %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if got := buf.String(); got != tc.want {
				t.Errorf("output = %q, want %q", got, tc.want)
			}
			if strings.ContainsRune(buf.String(), 0x1b) {
				t.Error("an escape character reached the terminal")
			}
		})
	}
	if err := NewConsole(failWriter{}).Post(context.Background(), p); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("errors.Is(err, fs.ErrClosed) = false for %v", err)
	}
}

// TestConsoleConcurrent: posts and alerts from many goroutines come out
// whole, each post followed by its separator.
func TestConsoleConcurrent(t *testing.T) {
	var buf testkit.SyncBuffer
	c := NewConsole(&buf)
	if c.Name() != "console" {
		t.Errorf("Name = %q", c.Name())
	}
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p := samplePost()
			p.Key = fmt.Sprintf("INBOX/1/%d", i)
			if err := c.Post(context.Background(), p); err != nil {
				t.Error(err)
			}
			if err := c.Alert(context.Background(), fmt.Sprintf("alert %d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	out := buf.String()
	for i := range n {
		p := samplePost()
		p.Key = fmt.Sprintf("INBOX/1/%d", i)
		if !strings.Contains(out, Text(p)+"\n"+consoleSeparator+"\n") {
			t.Errorf("post %s is not whole in the output", p.Key)
		}
		if !strings.Contains(out, fmt.Sprintf("ALERT: alert %d\n", i)) {
			t.Errorf("alert %d is not whole in the output", i)
		}
	}
}

func TestNewConsoleNil(t *testing.T) {
	if c := NewConsole(nil); c.w == nil {
		t.Error("NewConsole(nil) has no writer")
	}
}
