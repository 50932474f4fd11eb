package redactlog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

type stringer struct{}

func (stringer) String() string { return "via Stringer SECRET" }

func TestEverythingIsRedacted(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewTextHandler(&buf, nil), func(s string) string { return strings.ReplaceAll(s, "SECRET", "[redacted]") }))
	log = log.With("pre", "with SECRET").WithGroup("g")
	log.Info("msg SECRET", "s", "SECRET", "err", errors.New("dial https://x/botSECRET/getMe"),
		"st", stringer{}, "any", struct{ Tok string }{"SECRET"}, slog.Group("inner", "k", "SECRET"), "n", 42)
	out := buf.String()
	if strings.Contains(out, "SECRET") {
		t.Fatalf("secret leaked: %s", out)
	}
	if strings.Count(out, "[redacted]") != 7 || !strings.Contains(out, "g.n=42") {
		t.Fatalf("unexpected output: %s", out)
	}
}
