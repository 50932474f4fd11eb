package triage

import (
	"context"
	"errors"
	"fmt"
	"gpuhost/config"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"gpuhost/internal/loopback"
	"gpuhost/triage/customer"
	"gpuhost/triage/llm"
	"gpuhost/triage/sink"
	"gpuhost/triage/source"
)

// Deps are what FromConfig cannot read from gpuhost.yaml: the running
// daemon's pieces.
type Deps struct {
	// MCP is the client for the crm connector's read-only search tool
	// (mcp.Server.InProcessClient); nil with triage.crm.enabled is an error.
	MCP customer.Caller
	// Power is the GPU power for the energy cost of local model calls.
	Power PowerFunc
	// ManagedBaseURL is the daemon's own OpenAI-compatible endpoint
	// (default "http://<listen>/v1", a wildcard host becoming 127.0.0.1).
	ManagedBaseURL string
	// ActiveModel names the model the managed endpoint serves now, asked
	// for every mail when triage.model.model is empty (default: the
	// default profile's served name).
	ActiveModel func() string
	Log         *slog.Logger
	// HTTPClient carries the model, transcription and chat calls (default:
	// http.DefaultTransport with the per-call timeouts from config).
	HTTPClient *http.Client
	Clock      Clock
	// LookupEnv reads secrets at call time (default os.LookupEnv).
	LookupEnv func(string) (string, bool)
	// Stdout gets the console sink's posts when triage.console is set
	// (default os.Stdout); `gpuhost triage` passes the command's output.
	Stdout io.Writer
}

// The sinks FromConfig builds carry the operator alerts too.
var (
	_ Alerter = (*sink.Slack)(nil)
	_ Alerter = (*sink.Telegram)(nil)
	_ Alerter = (*sink.Console)(nil)
)

// FromConfig builds the worker of the `triage:` section. Secrets are read
// here and at call time from the environment variables and files the
// config names; a missing one is an error naming the variable, never its
// value. The source connects lazily (on the first poll), so an IMAP server
// that is down now is a poll failure, not a start failure.
func FromConfig(ctx context.Context, cfg *config.Config, deps Deps) (*Worker, error) {
	t := cfg.Triage
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.LookupEnv == nil {
		deps.LookupEnv = os.LookupEnv
	}
	log := deps.Log
	env := func(key, name string) (string, error) {
		v, ok := deps.LookupEnv(name)
		if !ok || strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%s: environment variable %s is not set", key, name)
		}
		return strings.TrimSpace(v), nil
	}
	optEnv := func(key, name string) (string, error) {
		if name == "" {
			return "", nil
		}
		return env(key, name)
	}

	// Mail source.
	var src source.Source
	switch t.Source.Kind {
	case "maildir":
		md, err := source.NewMaildir(t.Source.Maildir)
		if err != nil {
			return nil, fmt.Errorf("triage.source.maildir: %w", err)
		}
		src = md
	case "imap":
		password := func() (string, error) {
			if t.Source.PasswordFile != "" {
				b, err := os.ReadFile(t.Source.PasswordFile)
				if err != nil {
					return "", fmt.Errorf("triage.source.password_file: read %s: %w", t.Source.PasswordFile, err)
				}
				return strings.TrimSpace(string(b)), nil
			}
			return env("triage.source.password_env", t.Source.PasswordEnv)
		}
		if _, err := password(); err != nil {
			return nil, err
		}
		if t.Source.InsecureSkipVerify {
			log.Warn("triage: triage.source.insecure_skip_verify is on: the IMAP server's TLS certificate is not verified, so anyone on the path can read the mailbox password and the mail",
				"addr", t.Source.Addr)
		}
		src = source.NewIMAP(source.IMAPOptions{
			Addr:               t.Source.Addr,
			Security:           t.Source.Security,
			Username:           t.Source.Username,
			Password:           password,
			Mailbox:            t.Source.Mailbox,
			InsecureSkipVerify: t.Source.InsecureSkipVerify,
			Timeout:            t.Source.Timeout.D(),
			Log:                log.With("component", "triage-imap"),
		})
	default:
		return nil, fmt.Errorf("triage.source.kind: %q is not imap or maildir", t.Source.Kind)
	}
	if len(t.Rules.InternalDomains) > 0 && t.Rules.AuthservID == "" && !t.Rules.TrustFromHeader {
		log.Warn("triage: triage.rules.internal_domains is set without triage.rules.authserv_id: the internal-sender rule never fires (set the receiving server's authserv-id, or trust_from_header: true to trust the forgeable From header)")
	}
	if t.Rules.TrustFromHeader {
		log.Warn("triage: triage.rules.trust_from_header is on: any external sender can claim an internal From address to get importance 1 and skip the CRM lookup")
	}
	ok := false
	defer func() {
		if !ok {
			_ = src.Close()
		}
	}()

	// Classification.
	baseURL := t.Model.BaseURL
	local := baseURL == ""
	if local {
		baseURL = deps.ManagedBaseURL
		if baseURL == "" {
			var err error
			if baseURL, err = ManagedURL(cfg.Listen); err != nil {
				return nil, fmt.Errorf("triage.model.base_url is empty, so the daemon's endpoint is used, but %w", err)
			}
		}
	}
	apiKey, err := optEnv("triage.model.api_key_env", t.Model.APIKeyEnv)
	if err != nil {
		return nil, err
	}
	mkClassifier := func(model string) (*llm.Classifier, error) {
		return llm.NewClassifier(llm.ClassifierOptions{
			BaseURL: baseURL, Model: model, APIKey: apiKey,
			HTTPClient: deps.HTTPClient, Timeout: t.Model.Timeout.D(), Logger: log,
		})
	}
	var cls Classifier
	switch {
	case t.Model.Model != "":
		c, err := mkClassifier(t.Model.Model)
		if err != nil {
			return nil, fmt.Errorf("triage.model: %w", err)
		}
		cls = c
	default:
		active := deps.ActiveModel
		if active == nil {
			p := cfg.Profiles[cfg.DefaultProfile]
			if p == nil || p.ServedName == "" {
				return nil, errors.New("triage.model.model: not set, and there is no default_profile whose served name could stand in")
			}
			name := p.ServedName
			active = func() string { return name }
		}
		cls = &activeClassifier{model: active, build: mkClassifier}
	}

	// Transcription.
	var tr Transcriber
	trLocal := false
	if !t.Transcription.Disabled {
		tbase, tkey := t.Transcription.BaseURL, ""
		switch {
		case tbase != "":
			if tkey, err = optEnv("triage.transcription.api_key_env", t.Transcription.APIKeyEnv); err != nil {
				return nil, err
			}
		default:
			tbase, trLocal = baseURL, local
			tkey = apiKey
			if t.Transcription.APIKeyEnv != "" {
				if tkey, err = env("triage.transcription.api_key_env", t.Transcription.APIKeyEnv); err != nil {
					return nil, err
				}
			}
		}
		x, err := llm.NewTranscriber(llm.TranscriberOptions{
			BaseURL: tbase, Model: t.Transcription.Model, APIKey: tkey,
			HTTPClient: deps.HTTPClient, Timeout: t.Transcription.Timeout.D(), MaxBytes: t.Transcription.MaxBytes,
		})
		if err != nil {
			return nil, fmt.Errorf("triage.transcription: %w", err)
		}
		tr = x
	}

	// CRM.
	var customers Customers
	if t.CRM.Enabled {
		if deps.MCP == nil {
			return nil, errors.New("triage.crm.enabled: no MCP client for the crm connector (enable mcp.connectors.crm)")
		}
		customers = &customer.Lookup{Client: deps.MCP, Tool: t.CRM.Tool, ProfileURL: t.CRM.ProfileURL, Match: t.CRM.Match}
	}

	// Sinks.
	var sinks []sink.Sink
	if t.Slack.Enabled {
		tokenEnv := t.Slack.TokenEnv
		token := func() (string, error) { return env("triage.slack.token_env", tokenEnv) }
		if _, err := token(); err != nil {
			return nil, err
		}
		s, err := sink.NewSlack(sink.SlackOptions{
			Token: token, TokenSource: "environment variable " + tokenEnv,
			APIURL: t.Slack.APIURL, Channel: t.Slack.Channel,
			ImportantChannel: t.Slack.ImportantChannel, HTTPClient: deps.HTTPClient,
			Log: log,
		})
		if err != nil {
			return nil, fmt.Errorf("triage.slack: %w", err)
		}
		sinks = append(sinks, s)
	}
	if t.Telegram.Enabled {
		tc := cfg.Telegram
		tokenSource := "environment variable " + tc.TokenEnv
		if tc.TokenFile != "" {
			tokenSource = "telegram.token_file " + tc.TokenFile
		}
		token := func() (string, error) {
			if tc.TokenFile != "" {
				b, err := os.ReadFile(tc.TokenFile)
				if err != nil {
					return "", fmt.Errorf("telegram.token_file: read %s: %w", tc.TokenFile, err)
				}
				return strings.TrimSpace(string(b)), nil
			}
			return env("telegram.token_env", tc.TokenEnv)
		}
		if _, err := token(); err != nil {
			return nil, fmt.Errorf("triage.telegram needs the bot token: %w", err)
		}
		s, err := sink.NewTelegram(sink.TelegramOptions{
			Token: token, TokenSource: tokenSource,
			APIURL: tc.APIURL, StateDir: cfg.StateDir,
			ImportantOnly: t.Telegram.ImportantOnly, HTTPClient: deps.HTTPClient,
			Log: log,
		})
		if err != nil {
			return nil, fmt.Errorf("triage.telegram: %w", err)
		}
		sinks = append(sinks, s)
	}
	if t.Console {
		out := deps.Stdout
		if out == nil {
			out = os.Stdout
		}
		sinks = append(sinks, sink.NewConsole(out))
	}
	if len(sinks) == 0 {
		log.Warn("triage: no sink is enabled (triage.slack / triage.telegram / triage.console); results only reach the log and GET /api/triage")
	}

	w, err := New(Options{
		Source:           src,
		Classifier:       cls,
		ClassifierLocal:  local,
		Transcriber:      tr,
		TranscriberLocal: trLocal,
		Customers:        customers,
		Sinks:            sinks,
		Rules:            Rules{PriorityMailboxes: t.Rules.PriorityMailboxes, InternalDomains: t.Rules.InternalDomains, AuthservID: t.Rules.AuthservID, TrustFromHeader: t.Rules.TrustFromHeader},
		Threshold:        t.ImportantThreshold,
		StateDir:         cfg.StateDir,
		Clock:            deps.Clock,
		Power:            deps.Power,
		Prices:           t.Costs,
		Log:              log.With("component", "triage"),
		MaxMessageBytes:  t.MaxMessageBytes,
		MaxAudioBytes:    t.Transcription.MaxBytes,
		Rebaseline:       t.Rebaseline == nil || *t.Rebaseline,
		StartAtEnd:       t.FirstRun != "all",
		Interval:         t.Interval.D(),
		AlertFailures:    t.Alerting.FailuresBeforeAlert,
		RemindEvery:      t.Alerting.RemindEvery.D(),
		KeepResults:      t.KeepResults,
	})
	if err != nil {
		return nil, err
	}
	ok = true
	return w, nil
}

// ManagedURL is the daemon's own OpenAI-compatible endpoint for a listen
// address: a wildcard host is reached on 127.0.0.1 (loopback.DialHost).
func ManagedURL(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen %q is not host:port: %w", listen, err)
	}
	if port == "0" {
		return "", fmt.Errorf("listen %q has no fixed port; pass the bound address (Deps.ManagedBaseURL)", listen)
	}
	return "http://" + net.JoinHostPort(loopback.DialHost(host), port) + "/v1", nil
}

// activeClassifier follows the managed endpoint's active model: after a
// model switch the next mail goes to the new served name instead of
// failing with "model not found".
type activeClassifier struct {
	model func() string
	build func(model string) (*llm.Classifier, error)

	mu   sync.Mutex
	name string
	c    *llm.Classifier
}

func (a *activeClassifier) Classify(ctx context.Context, in llm.Input) (llm.Classification, []llm.Usage, error) {
	name := a.model()
	if name == "" {
		return llm.Classification{}, nil, errors.New("no model is active on the managed endpoint")
	}
	a.mu.Lock()
	if a.c == nil || a.name != name {
		c, err := a.build(name)
		if err != nil {
			a.mu.Unlock()
			return llm.Classification{}, nil, fmt.Errorf("classifier for model %s: %w", name, err)
		}
		a.c, a.name = c, name
	}
	c := a.c
	a.mu.Unlock()
	return c.Classify(ctx, in)
}
