package appliance

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpuhost/config"
)

// TestStateFileIsBounded: state.json was read whole (a 200 MB file took the
// daemon to 645 MB RSS) and its value logged verbatim. The read stops at
// maxStateFileBytes, and nothing long from the file reaches the log.
func TestStateFileIsBounded(t *testing.T) {
	long := strings.Repeat("x", 10_000)
	tests := []struct {
		name     string
		content  string
		want     string // the last wanted profile read back
		wantLog  string // substring of the log; "" = no warning
		maxLogLn int
	}{
		{"valid", `{"last_wanted_profile":"p1","at":"2026-01-01T00:00:00Z"}`, "p1", "", 0},
		{"at the limit", `{"last_wanted_profile":"p1"}` + strings.Repeat(" ", maxStateFileBytes-len(`{"last_wanted_profile":"p1"}`)), "p1", "", 0},
		{"beyond the limit", `{"last_wanted_profile":"p1"}` + strings.Repeat(" ", maxStateFileBytes), "", `limit_bytes=65536`, 300},
		{"long profile name", `{"last_wanted_profile":"` + long + `"}`, "", "profile_bytes=10000", 300},
		{"not JSON", "\x00garbage", "", "ignoring unreadable state file", 300},
		{"missing", "", "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			cfg, err := config.Parse("test.yaml", []byte(strings.Replace(minimal, "/var/lib/gpuhost", state, 1)))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(state, "state.json")
			if tt.content != "" {
				if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var logBuf bytes.Buffer
			sup := NewSupervisor(cfg, nil, nil, nil, slog.New(slog.NewTextHandler(&logBuf, nil)))
			if got := sup.State().LastWanted; got != tt.want {
				t.Errorf("last wanted = %.40q (%d bytes), want %q", got, len(got), tt.want)
			}
			logText := logBuf.String()
			if tt.wantLog == "" {
				if logText != "" {
					t.Errorf("unexpected log: %s", logText)
				}
				return
			}
			if !strings.Contains(logText, tt.wantLog) || !strings.Contains(logText, path) {
				t.Errorf("log %q lacks %q and the file name", logText, tt.wantLog)
			}
			if len(logText) > tt.maxLogLn {
				t.Errorf("log is %d bytes (at most %d): %.200s…", len(logText), tt.maxLogLn, logText)
			}
		})
	}
}

// minimal is the smallest config the Supervisor accepts: one vLLM profile.
const minimal = `
state_dir: /var/lib/gpuhost
profiles:
  p1:
    backend: vllm
    model: org/model
    port: 8000
`
