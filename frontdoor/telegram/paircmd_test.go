package telegram

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/internal/pairing"
)

func TestPairCommand(t *testing.T) {
	type step struct {
		args    []string
		wantOut []string
		wantErr string
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, s *pairing.Store) map[string]string // placeholders → values
		steps []step
	}{
		{
			name: "empty state",
			steps: []step{
				{args: []string{"list"}, wantOut: []string{"no pending pairing codes", "allowlist is empty"}},
				{args: []string{"approve", "ABCDEFGH"}, wantErr: "unknown pairing code ABCDEFGH"},
				{args: []string{"revoke", "5"}, wantErr: "user 5: not on the allowlist"},
			},
		},
		{
			name: "approve, list, revoke",
			setup: func(t *testing.T, s *pairing.Store) map[string]string {
				out, err := s.Request(pairing.Sender{UserID: 77, ChatID: 77, Username: "bob", FirstName: "Bob"})
				if err != nil {
					t.Fatal(err)
				}
				return map[string]string{"CODE": out.Code}
			},
			steps: []step{
				{args: []string{"list"}, wantOut: []string{"CODE", "77", "@bob", "Bob", "valid for"}},
				{args: []string{"approve", "CODE"}, wantOut: []string{"approved user 77 (@bob, Bob)"}},
				{args: []string{"list"}, wantOut: []string{"no pending pairing codes", "allowlisted users", "77", "@bob"}},
				{args: []string{"revoke", "77"}, wantOut: []string{"revoked user 77 (@bob, Bob)"}},
				{args: []string{"list"}, wantOut: []string{"allowlist is empty"}},
			},
		},
		{
			name: "bad arguments",
			steps: []step{
				{args: []string{"approve"}, wantErr: "accepts 1 arg"},
				{args: []string{"approve", "0OIL"}, wantErr: "malformed pairing code"},
				{args: []string{"revoke", "@bob"}, wantErr: `"@bob" is not a Telegram user id`},
				{args: []string{"revoke", "0"}, wantErr: "not a Telegram user id"},
			},
		},
		{
			name: "corrupt allowlist is reported, never rewritten",
			setup: func(t *testing.T, s *pairing.Store) map[string]string {
				out, err := s.Request(pairing.Sender{UserID: 77, ChatID: 77})
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(s.AllowlistPath(), []byte("{oops"), 0o600); err != nil {
					t.Fatal(err)
				}
				return map[string]string{"CODE": out.Code}
			},
			steps: []step{
				{args: []string{"list"}, wantOut: []string{"allowlist: unreadable", "answers nobody"}, wantErr: "allowlist.json"},
				{args: []string{"approve", "CODE"}, wantErr: "not changing it"},
				{args: []string{"revoke", "77"}, wantErr: "allowlist.json"},
			},
		},
		{
			name: "purge",
			setup: func(t *testing.T, s *pairing.Store) map[string]string {
				now := time.Now()
				s.Now = func() time.Time { return now.Add(-pairing.CodeTTL - time.Minute) }
				if _, err := s.Request(pairing.Sender{UserID: 77, ChatID: 77}); err != nil {
					t.Fatal(err)
				}
				s.Now = nil
				out, err := s.Request(pairing.Sender{UserID: 78, ChatID: 78})
				if err != nil {
					t.Fatal(err)
				}
				return map[string]string{"CODE": out.Code}
			},
			steps: []step{
				{args: []string{"purge"}, wantOut: []string{"purged 1 pairing code(s)", "allowlist is unchanged"}},
				{args: []string{"list"}, wantOut: []string{"CODE", "78", "valid for"}},
				{args: []string{"purge", "--all"}, wantOut: []string{"purged 1 pairing code(s)"}},
				{args: []string{"list"}, wantOut: []string{"no pending pairing codes"}},
			},
		},
		{
			name: "purge --all replaces a corrupt pending file",
			setup: func(t *testing.T, s *pairing.Store) map[string]string {
				if err := os.MkdirAll(s.Dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(s.PendingPath(), []byte("{oops"), 0o600); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			steps: []step{
				{args: []string{"purge"}, wantErr: "purge --all"},
				{args: []string{"purge", "--all"}, wantOut: []string{"replaced the unreadable", "pending.json"}},
				{args: []string{"list"}, wantOut: []string{"no pending pairing codes"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := pairing.New(dir)
			subst := map[string]string{}
			if tc.setup != nil {
				if m := tc.setup(t, s); m != nil {
					subst = m
				}
			}
			for _, st := range tc.steps {
				args := append([]string(nil), st.args...)
				for i := range args {
					if v, ok := subst[args[i]]; ok {
						args[i] = v
					}
				}
				out, err := runPair(t, dir, args...)
				if st.wantErr == "" && err != nil {
					t.Fatalf("pair %v: %v\n%s", args, err, out)
				}
				if st.wantErr != "" && (err == nil || !strings.Contains(err.Error(), st.wantErr)) {
					t.Fatalf("pair %v error = %v, want one containing %q", args, err, st.wantErr)
				}
				for _, w := range st.wantOut {
					if v, ok := subst[w]; ok {
						w = v
					}
					if !strings.Contains(out, w) {
						t.Errorf("pair %v output lacks %q:\n%s", args, w, out)
					}
				}
			}
		})
	}
}

func TestPairListJSON(t *testing.T) {
	dir := t.TempDir()
	s := pairing.New(dir)
	if _, err := s.Request(pairing.Sender{UserID: 9, ChatID: 9, Username: "z"}); err != nil {
		t.Fatal(err)
	}
	out, err := runPair(t, dir, "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Pending   []pairing.Pending `json:"pending"`
		Allowlist []pairing.Entry   `json:"allowlist"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(got.Pending) != 1 || got.Pending[0].UserID != 9 || got.Allowlist == nil || len(got.Allowlist) != 0 {
		t.Errorf("list --json = %s", out)
	}
}

func TestPairStateDirError(t *testing.T) {
	want := errors.New("config /etc/gpuhost/gpuhost.yaml: state_dir: must be absolute")
	c := NewPairCmd(func(*cobra.Command) (string, error) { return "", want })
	c.SetArgs([]string{"list"})
	c.SetOut(new(strings.Builder))
	c.SetErr(new(strings.Builder))
	if err := c.Execute(); !errors.Is(err, want) {
		t.Errorf("error = %v, want the config error", err)
	}
}
