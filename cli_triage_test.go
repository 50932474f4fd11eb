package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/simulator"
	"gpuhost/triage"
	"gpuhost/triage/demo"
)

// triageSim runs the simulator in this process and returns its /v1 URL.
func triageSim(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- simulator.Run(ctx, simulator.Options{
			Flavor: simulator.FlavorVLLM, Addr: "127.0.0.1:0", Model: "qwen3-triage",
			LoadTime: time.Nanosecond, PrefillTPS: 2e6, DecodeTPS: 2e6,
			Logger: slog.New(slog.DiscardHandler), Ready: func(a string) { addr <- a },
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-addr:
		return "http://" + a + "/v1"
	case err := <-done:
		t.Fatalf("simulator: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("simulator not ready")
	}
	return ""
}

// triageConfig writes a config whose triage section reads a Maildir seeded
// with the demo mails (or the given source section) and classifies on the
// simulator.
func triageConfig(t *testing.T, enabled bool, source string) (cfgPath, state string) {
	t.Helper()
	dir := t.TempDir()
	state = filepath.Join(dir, "state")
	md := filepath.Join(dir, "Maildir")
	if _, err := demo.Seed(md); err != nil {
		t.Fatal(err)
	}
	if source == "" {
		source = "    kind: maildir\n    maildir: " + md + "\n"
	}
	cfg := testbin.ConfigYAML("/bin/true", state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms") +
		"triage:\n  enabled: " + map[bool]string{true: "true", false: "false"}[enabled] + "\n  interval: 200ms\n  first_run: all\n  source:\n" + source +
		"  model:\n    base_url: " + triageSim(t) + "\n    model: qwen3-triage\n" +
		"  rules:\n    priority_mailboxes: [urgent@ourcompany.example]\n    internal_domains: [ourcompany.example]\n    authserv_id: mx.ourcompany.example\n"
	cfgPath = filepath.Join(dir, "gpuhost.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgPath, state
}

func runTriageCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append(args, "--log-level", "error"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func TestTriageCLI(t *testing.T) {
	cfg, state := triageConfig(t, true, "")
	eml := filepath.Join(t.TempDir(), "inquiry.eml")
	_, raws, err := demo.Mails()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(eml, raws[0], 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		want    []string // substrings of the output
		wantErr string
	}{
		{"dry run of a file", []string{"triage", "mail", "--eml", eml, "--dry-run"},
			[]string{"Dry run", "Offer for 40 additional licences?", "Anna Berger", "key: manual/eml/"}, ""},
		{"dry run of a UID shows the header unsubscribe link", []string{"triage", "mail", "--uid", "2", "--dry-run"},
			[]string{"Unsubscribe: https://news.toolvendor.example/u/4711?list=weekly&sig=Zm9v%2Bbar"}, ""},
		{"dry run of the priority mail shows the rule", []string{"triage", "mail", "--uid", "5", "--dry-run"},
			[]string{"10", "priority mailbox urgent@ourcompany.example"}, ""},
		{"json", []string{"triage", "mail", "--uid", "4", "--dry-run", "--json"}, []string{`"importance": 1`, `"rule": "internal sender (ourcompany.example; dmarc=pass header.from=ourcompany.example per mx.ourcompany.example)"`}, ""},
		{"neither flag", []string{"triage", "mail"}, nil, "exactly one of --uid"},
		{"both flags", []string{"triage", "mail", "--uid", "1", "--eml", eml}, nil, "exactly one of --uid"},
		{"unknown UID", []string{"triage", "mail", "--uid", "99", "--dry-run"}, nil, "no mail with UID 99"},
		{"missing file", []string{"triage", "mail", "--eml", eml + ".nope", "--dry-run"}, nil, "inquiry.eml.nope"},
		{"once processes the mailbox", []string{"triage", "once"}, []string{"6 mail(s) processed"}, ""},
		{"once again finds nothing new", []string{"triage", "once"}, []string{"0 mail(s) processed"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runTriageCLI(t, append(tt.args, "--config", cfg)...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q\n%s", err, tt.wantErr, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(strings.Join(tt.args, " "), "--json") {
				var r triage.Result
				if err := json.Unmarshal([]byte(out), &r); err != nil || r.Key == "" {
					t.Errorf("not a result JSON (%v):\n%s", err, out)
				}
			}
		})
	}
	// Only `once` moved the checkpoint; the manual runs did not.
	ents, _ := os.ReadDir(filepath.Join(state, "triage"))
	if len(ents) != 1 {
		t.Fatalf("state/triage holds %d files, want the one checkpoint", len(ents))
	}
	data, _ := os.ReadFile(filepath.Join(state, "triage", ents[0].Name()))
	if !strings.Contains(string(data), `"last_uid": 6`) {
		t.Errorf("checkpoint after once:\n%s", data)
	}
}

func TestTriageCLIConfigErrors(t *testing.T) {
	const secret = "hunter2-not-for-logs"
	t.Setenv("TRIAGE_CLI_TEST_SET", secret)
	disabled, _ := triageConfig(t, false, "")
	imapUnset, _ := triageConfig(t, true, "    kind: imap\n    addr: 127.0.0.1:1\n    security: plain\n    username: u\n    password_env: TRIAGE_CLI_TEST_UNSET\n")
	imapDown, _ := triageConfig(t, true, "    kind: imap\n    addr: 127.0.0.1:1\n    security: plain\n    username: u\n    password_env: TRIAGE_CLI_TEST_SET\n    timeout: 5s\n")
	for _, tt := range []struct {
		name, cfg, want string
	}{
		{"triage disabled", disabled, "triage.enabled is false"},
		{"IMAP password variable unset", imapUnset, "environment variable TRIAGE_CLI_TEST_UNSET is not set"},
		{"IMAP server unreachable", imapDown, "127.0.0.1:1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runTriageCLI(t, "triage", "once", "--config", tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q\n%s", err, tt.want, out)
			}
			if strings.Contains(err.Error()+out, secret) {
				t.Error("a secret leaked into the output")
			}
		})
	}
}

// TestTriageRunStopsOnSIGTERM: the real binary polls in the foreground,
// processes the mailbox and exits 0 on SIGTERM.
func TestTriageRunStopsOnSIGTERM(t *testing.T) {
	cfg, state := triageConfig(t, true, "")
	cmd := exec.Command(binPath, "triage", "run", "--config", cfg, "--log-level", "warn")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ents, _ := os.ReadDir(filepath.Join(state, "triage"))
		if len(ents) == 1 {
			data, _ := os.ReadFile(filepath.Join(state, "triage", ents[0].Name()))
			if strings.Contains(string(data), `"last_uid": 6`) && !strings.Contains(string(data), "inflight") {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("triage run exited on its own: %v\n%s", err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("the demo mails were not processed in 90s\n%s", out.String())
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("triage run ignored SIGTERM for 30s")
	}
}
