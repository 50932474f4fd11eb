package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/config"
)

// TestTriageFollowsTheFoundDaemon: a triage worker beside the daemon asks
// the daemon the one rule finds ($GPUHOST_URL here, not the config's
// listen) with $GPUHOST_API_TOKEN, and classifies on its active profile's
// served name; while the daemon has none active, or does not answer, on
// the default profile's.
func TestTriageFollowsTheFoundDaemon(t *testing.T) {
	cfg, err := config.Demo("/bin/true", t.TempDir(), "127.0.0.1:1") // nothing listens on the config's address
	if err != nil {
		t.Fatal(err)
	}
	var other string
	for name := range cfg.Profiles {
		if name != cfg.DefaultProfile {
			other = name
		}
	}
	if other == "" {
		t.Fatal("the demo config needs two profiles")
	}
	fallback := cfg.Profiles[cfg.DefaultProfile].ServedModelName()
	want := cfg.Profiles[other].ServedModelName()
	tests := []struct {
		name  string
		phase api.Phase
		token string
		want  string
	}{
		{name: "active profile, token from the environment", phase: api.PhaseActive, token: "s3cret", want: want},
		{name: "switching: the default profile's", phase: api.PhaseSwitching, token: "s3cret", want: fallback},
		{name: "no token: 401, so the default profile's", phase: api.PhaseActive, want: fallback},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls++
				if r.URL.Path != "/api/status" || r.Header.Get("Authorization") != "Bearer s3cret" {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				st := api.Status{State: api.State{Phase: tc.phase, Profile: other},
					Profiles: []api.ProfileInfo{{Name: other, Model: cfg.Profiles[other].Model, ServedName: cfg.Profiles[other].ServedName}}}
				_ = json.NewEncoder(w).Encode(st)
			}))
			defer srv.Close()
			t.Setenv(envDaemonURL, srv.URL)
			t.Setenv("GPUHOST_API_TOKEN", tc.token)
			cmd := &cobra.Command{Use: "x"}
			cmd.Flags().String("config", "", "")
			active, err := triageActiveModel(cmd, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := active(); got != tc.want || calls != 1 {
				t.Errorf("active model %q after %d request(s) to $GPUHOST_URL, want %q after 1", got, calls, tc.want)
			}
		})
	}
}
