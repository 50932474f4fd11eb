package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestCalibrate(t *testing.T) {
	for _, c := range []struct {
		name     string
		count    func(chars int) int
		target   int
		exact    bool
		maxCalls int
		wantErr  string
	}{
		// Byte-pair: a word of 6 characters is one token, 20 tokens of template and prefix.
		{name: "bpe", count: func(n int) int { return 20 + (n+5)/6 }, target: 8192, exact: true, maxCalls: 8},
		// Character-level (the tiny GGUF): one token per character.
		{name: "char", count: func(n int) int { return 60 + n }, target: 1024, exact: true, maxCalls: 4},
		// Counts move in steps of 2: 1001 cannot be hit; the closest below wins.
		{name: "steps of two", count: func(n int) int { return 10 + 2*(n/7) }, target: 1001, maxCalls: 40},
		// The server truncates at 500 tokens.
		{name: "truncating", count: func(n int) int { return min(30+n/4, 500) }, target: 2000, maxCalls: 40,
			wantErr: "truncates"},
		{name: "template too long", count: func(n int) int { return 300 + n }, target: 100, maxCalls: 2, wantErr: "alone are 300"},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			cal, err := calibrate(context.Background(), c.target, 40, func(_ context.Context, chars int) (int, error) {
				calls++
				return c.count(chars), nil
			})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.count(cal.chars); got != cal.tokens || got > c.target || (c.exact && got != c.target) {
				t.Fatalf("chars %d → %d tokens (reported %d), target %d", cal.chars, got, cal.tokens, c.target)
			}
			if !c.exact && cal.tokens < c.target-2 {
				t.Fatalf("closest %d, want within 2 below %d", cal.tokens, c.target)
			}
			if calls > c.maxCalls {
				t.Errorf("%d counts, want ≤ %d", calls, c.maxCalls)
			}
		})
	}
	boom := errors.New("boom")
	if _, err := calibrate(context.Background(), 100, 10, func(context.Context, int) (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("counter error not passed on: %v", err)
	}
}

func TestPromptText(t *testing.T) {
	a, b := promptText(500), promptText(500)
	if a == b {
		t.Fatal("two prompts share their random prefix")
	}
	// Same length and same filler: only the prefix differs.
	if len(a) != len(b) || a[len(a)-400:] != b[len(b)-400:] {
		t.Fatalf("prompts differ beyond the prefix:\n%q\n%q", a, b)
	}
	if n := len(strings.Fields(randomPrefix())); n != prefixWords {
		t.Fatalf("prefix has %d words", n)
	}
	for _, w := range words {
		if len(w) != 5 {
			t.Fatalf("word %q is not five letters", w)
		}
	}
	if got := len(fillerPrefix(100000)); got != 100000 {
		t.Fatalf("filler %d chars", got)
	}
}
