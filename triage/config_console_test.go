package triage

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"gpuhost/config"
	"gpuhost/triage/sink"
)

func TestFromConfigConsole(t *testing.T) {
	md := t.TempDir()
	writeMaildir(t, md, 0)
	base := "triage:\n  enabled: true\n  source:\n    kind: maildir\n    maildir: " + md + "\n"
	tests := []struct {
		name      string
		yaml      string
		wantSinks string
		wantWarn  bool
	}{
		{"console only", base + "  console: true\n", "console", false},
		{"slack and console", base + "  console: true\n  slack: {enabled: true, channel: C1}\n", "slack,console", false},
		{"no sink at all", base, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs, out bytes.Buffer
			cfg := parseTestConfig(t, tt.yaml)
			w, err := FromConfig(context.Background(), cfg.Triage, testDaemon(cfg), Deps{
				LookupEnv:      func(k string) (string, bool) { return "xoxb-test", k == "SLACK_BOT_TOKEN" },
				ManagedBaseURL: "http://127.0.0.1:18080/v1",
				Log:            slog.New(slog.NewTextHandler(&logs, nil)),
				Stdout:         &out,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			var names []string
			for _, s := range w.o.Sinks {
				names = append(names, s.Name())
			}
			if got := strings.Join(names, ","); got != tt.wantSinks {
				t.Errorf("sinks = %q, want %q", got, tt.wantSinks)
			}
			if warned := strings.Contains(logs.String(), "no sink is enabled"); warned != tt.wantWarn {
				t.Errorf("no-sink warning logged = %v, want %v:\n%s", warned, tt.wantWarn, logs.String())
			}
			for _, s := range w.o.Sinks {
				if s.Name() != "console" {
					continue
				}
				if err := s.Post(context.Background(), sink.Post{Key: "k/1/1", Subject: "to the console"}); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(out.String(), "to the console") {
					t.Errorf("console post did not reach Deps.Stdout: %q", out.String())
				}
			}
		})
	}
}

// TestHandFed: the worker without a config file has no mailbox (polling and
// --uid say what they need), no sinks and no "no sink" warning, and needs
// the daemon's /v1.
func TestHandFed(t *testing.T) {
	var logs bytes.Buffer
	tc := config.DefaultTriage()
	tc.Model.Model = "qwen3-coder"
	if _, err := HandFed(tc, t.TempDir(), Deps{}); err == nil || !strings.Contains(err.Error(), "ManagedBaseURL") {
		t.Errorf("without the daemon's /v1: %v", err)
	}
	w, err := HandFed(tc, t.TempDir(), Deps{ManagedBaseURL: "http://127.0.0.1:18080/v1", Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if len(w.o.Sinks) != 0 || strings.Contains(logs.String(), "no sink is enabled") {
		t.Errorf("sinks %d, logs:\n%s", len(w.o.Sinks), logs.String())
	}
	if _, err := w.Once(context.Background()); err == nil || !strings.Contains(err.Error(), "triage: section of a config file") {
		t.Errorf("Once on a hand-fed worker: %v", err)
	}
	if _, err := w.ProcessUID(context.Background(), 1, true); err == nil || !strings.Contains(err.Error(), "no mailbox") {
		t.Errorf("ProcessUID on a hand-fed worker: %v", err)
	}
}
