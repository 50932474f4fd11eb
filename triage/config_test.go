package triage

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/config"
	"gpuhost/internal/testbin"
	"gpuhost/triage/llm"
)

func parseTestConfig(t *testing.T, triageYAML string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	y := testbin.ConfigYAML("/bin/true", filepath.Join(dir, "state"), "process", "", 18000, 18001, "10ms") + triageYAML
	cfg, err := config.Parse("test.yaml", []byte(y))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return cfg
}

// testDaemon is the Daemon that internal/assemble builds from cfg.
func testDaemon(cfg *config.Config) Daemon {
	d := Daemon{StateDir: cfg.StateDir, Listen: cfg.Listen, Telegram: cfg.Telegram}
	if p := cfg.Profiles[cfg.DefaultProfile]; p != nil {
		d.DefaultModel = p.ServedName
	}
	return d
}

func TestFromConfig(t *testing.T) {
	const secret = "SECRET-VALUE-never-shown"
	md := t.TempDir()
	writeMaildir(t, md, 0)
	maildir := "  source:\n    kind: maildir\n    maildir: " + md + "\n"
	env := func(set ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for _, s := range set {
				if s == k {
					return secret, true
				}
			}
			return "", false
		}
	}
	tests := []struct {
		name    string
		yaml    string
		env     []string
		deps    func(*Deps)
		wantErr string
		check   func(t *testing.T, w *Worker)
	}{
		{
			name: "maildir, slack and telegram, the model follows the active profile",
			yaml: "triage:\n  enabled: true\n" + maildir +
				"  slack: {enabled: true, channel: C1}\n  telegram: {enabled: true, important_only: true}\n",
			env: []string{"SLACK_BOT_TOKEN", "GPUHOST_TELEGRAM_TOKEN"},
			check: func(t *testing.T, w *Worker) {
				if len(w.o.Sinks) != 2 || w.o.Sinks[0].Name() != "slack" || w.o.Sinks[1].Name() != "telegram" {
					t.Errorf("sinks = %v", w.o.Sinks)
				}
				if _, ok := w.o.Classifier.(*activeClassifier); !ok || !w.o.ClassifierLocal || !w.o.TranscriberLocal {
					t.Errorf("classifier %T local %v/%v, want the managed endpoint's active model", w.o.Classifier, w.o.ClassifierLocal, w.o.TranscriberLocal)
				}
				if w.o.Threshold != 7 || w.o.AlertFailures != 3 || w.o.RemindEvery != 6*time.Hour || !w.o.Rebaseline {
					t.Errorf("defaults not applied: %+v", w.o)
				}
			},
		},
		{
			name: "remote model with a key; transcription off",
			yaml: "triage:\n  enabled: true\n" + maildir +
				"  model: {base_url: 'https://api.openai.com/v1', model: gpt-4o-mini, api_key_env: OPENAI_API_KEY}\n  transcription: {disabled: true}\n",
			env: []string{"OPENAI_API_KEY"},
			check: func(t *testing.T, w *Worker) {
				if w.o.ClassifierLocal || w.o.Transcriber != nil {
					t.Errorf("local %v transcriber %v", w.o.ClassifierLocal, w.o.Transcriber)
				}
			},
		},
		{name: "slack token missing", yaml: "triage:\n  enabled: true\n" + maildir + "  slack: {enabled: true, channel: C1}\n",
			wantErr: "triage.slack.token_env: environment variable SLACK_BOT_TOKEN is not set"},
		{name: "telegram token missing", yaml: "triage:\n  enabled: true\n" + maildir + "  telegram: {enabled: true}\n",
			wantErr: "environment variable GPUHOST_TELEGRAM_TOKEN is not set"},
		{name: "model key missing", yaml: "triage:\n  enabled: true\n" + maildir + "  model: {api_key_env: TRIAGE_KEY}\n",
			wantErr: "triage.model.api_key_env: environment variable TRIAGE_KEY is not set"},
		{name: "imap password missing",
			yaml:    "triage:\n  enabled: true\n  source: {kind: imap, addr: '127.0.0.1:143', security: plain, username: u, password_env: TRIAGE_PW}\n",
			wantErr: "triage.source.password_env: environment variable TRIAGE_PW is not set"},
		{name: "imap password file missing",
			yaml:    "triage:\n  enabled: true\n  source: {kind: imap, addr: '127.0.0.1:143', security: plain, username: u, password_file: /nonexistent/pw}\n",
			wantErr: "triage.source.password_file: read /nonexistent/pw"},
		{name: "imap with its password", env: []string{"TRIAGE_PW"},
			yaml: "triage:\n  enabled: true\n  source: {kind: imap, addr: '127.0.0.1:143', security: plain, username: u, password_env: TRIAGE_PW}\n",
			check: func(t *testing.T, w *Worker) {
				if !strings.HasPrefix(w.Name(), "imap://") {
					t.Errorf("mailbox name %q", w.Name())
				}
			}},
		{name: "crm without an MCP client", yaml: "triage:\n  enabled: true\n" + maildir + "  crm: {enabled: true}\n",
			wantErr: "no MCP client"},
		{name: "no fixed port for the managed endpoint", yaml: "triage:\n  enabled: true\n" + maildir,
			deps: func(d *Deps) { d.ManagedBaseURL = "" }, wantErr: "no fixed port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := parseTestConfig(t, tt.yaml)
			deps := Deps{LookupEnv: env(tt.env...), ManagedBaseURL: "http://127.0.0.1:18080/v1", Log: testLogger(t)}
			if tt.deps != nil {
				tt.deps(&deps)
			}
			w, err := FromConfig(context.Background(), cfg.Triage, testDaemon(cfg), deps)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error shows a secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if tt.check != nil {
				tt.check(t, w)
			}
		})
	}
}

func TestManagedURL(t *testing.T) {
	for _, tt := range []struct{ listen, want, err string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080/v1", ""},
		{"0.0.0.0:8080", "http://127.0.0.1:8080/v1", ""},
		{":8080", "http://127.0.0.1:8080/v1", ""},
		{"[::]:9000", "http://127.0.0.1:9000/v1", ""},
		{"[0:0:0:0:0:0:0:0]:9000", "http://127.0.0.1:9000/v1", ""}, // any spelling of the wildcard
		{"[::1]:9000", "http://[::1]:9000/v1", ""},
		{"127.0.0.1:0", "", "no fixed port"},
		{"nonsense", "", "not host:port"},
	} {
		got, err := ManagedURL(tt.listen)
		if got != tt.want || (tt.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("ManagedURL(%q) = %q, %v; want %q, %q", tt.listen, got, err, tt.want, tt.err)
		}
	}
}

func TestActiveClassifierFollowsSwitches(t *testing.T) {
	model := "qwen3-coder"
	var built []string
	a := &activeClassifier{
		model: func() string { return model },
		build: func(name string) (*llm.Classifier, error) {
			built = append(built, name)
			return llm.NewClassifier(llm.ClassifierOptions{BaseURL: "http://127.0.0.1:1/v1", Model: name, Timeout: time.Second})
		},
	}
	ctx := context.Background()
	for _, m := range []string{"qwen3-coder", "qwen3-coder", "llama3.1:8b", ""} {
		model = m
		_, _, err := a.Classify(ctx, llm.Input{Subject: "x"})
		if err == nil {
			t.Fatal("classified against a closed port")
		}
		if m == "" && !strings.Contains(err.Error(), "no model is active") {
			t.Errorf("no active model: %v", err)
		}
	}
	if strings.Join(built, ",") != "qwen3-coder,llama3.1:8b" {
		t.Errorf("built %v, want one classifier per model switch", built)
	}
}

// TestInsecureSkipVerifyWarnsAtStart: turning certificate checks off is
// logged as a warning when the worker is built.
func TestInsecureSkipVerifyWarnsAtStart(t *testing.T) {
	for _, insecure := range []bool{false, true} {
		cfg := parseTestConfig(t, fmt.Sprintf("triage:\n  enabled: true\n  source: {kind: imap, addr: 'mail.example.test:993', security: tls, username: u, password_env: TRIAGE_PW, insecure_skip_verify: %v}\n", insecure))
		var buf bytes.Buffer
		deps := Deps{LookupEnv: func(k string) (string, bool) { return "pw", k == "TRIAGE_PW" },
			ManagedBaseURL: "http://127.0.0.1:18080/v1", Log: slog.New(slog.NewTextHandler(&buf, nil))}
		w, err := FromConfig(context.Background(), cfg.Triage, testDaemon(cfg), deps)
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		warned := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "insecure_skip_verify")
		if warned != insecure {
			t.Errorf("insecure_skip_verify %v: warned %v; log:\n%s", insecure, warned, buf.String())
		}
	}
}

// TestInternalRuleConfig: authserv_id and trust_from_header reach the
// rules, and a rule that can never fire (or trusts the From header) is
// logged at start.
func TestInternalRuleConfig(t *testing.T) {
	md := t.TempDir()
	writeMaildir(t, md, 0)
	tests := []struct {
		rules, warn string
		id          string
		trust       bool
	}{
		{"internal_domains: [example.com], authserv_id: mx.example.com", "", "mx.example.com", false},
		{"internal_domains: [example.com]", "never fires", "", false},
		{"internal_domains: [example.com], trust_from_header: true", "trust_from_header is on", "", true},
	}
	for _, tt := range tests {
		cfg := parseTestConfig(t, "triage:\n  enabled: true\n  source: {kind: maildir, maildir: "+md+"}\n  rules: {"+tt.rules+"}\n")
		var buf bytes.Buffer
		w, err := FromConfig(context.Background(), cfg.Triage, testDaemon(cfg), Deps{LookupEnv: func(string) (string, bool) { return "", false },
			ManagedBaseURL: "http://127.0.0.1:18080/v1", Log: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		if w.o.Rules.AuthservID != tt.id || w.o.Rules.TrustFromHeader != tt.trust {
			t.Errorf("%s: rules = %+v", tt.rules, w.o.Rules)
		}
		warned := strings.Contains(buf.String(), "level=WARN msg=\"triage: triage.rules")
		if warned != (tt.warn != "") || (tt.warn != "" && !strings.Contains(buf.String(), tt.warn)) {
			t.Errorf("%s: log %q, want a warning containing %q", tt.rules, buf.String(), tt.warn)
		}
	}
}
