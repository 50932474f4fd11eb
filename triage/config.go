package triage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"gpuhost/config"
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

// Daemon are the daemon-wide facts FromConfig needs besides the triage:
// section (internal/assemble builds them from gpuhost.yaml).
type Daemon struct {
	// StateDir holds the worker's checkpoints and results, and the bot's
	// pairing store the triage.telegram sink reads its chats from.
	StateDir string
	// Listen is the daemon's listen address: with Deps.ManagedBaseURL
	// empty, the managed endpoint is ManagedURL(Listen).
	Listen string
	// DefaultModel is the default profile's served name, the model when
	// triage.model.model is empty and Deps.ActiveModel is nil ("": none).
	DefaultModel string
	// Telegram is the telegram: section, whose bot token and API server
	// the triage.telegram sink posts with.
	Telegram config.TelegramConfig
}

// The sinks FromConfig builds carry the operator alerts too.
var (
	_ Alerter = (*sink.Slack)(nil)
	_ Alerter = (*sink.Telegram)(nil)
	_ Alerter = (*sink.Console)(nil)
)

// FromConfig builds the worker of the `triage:` section t. Secrets are read
// here and at call time from the environment variables and files the
// config names; a missing one is an error naming the variable, never its
// value. The source connects lazily (on the first poll), so an IMAP server
// that is down now is a poll failure, not a start failure.
func FromConfig(ctx context.Context, t config.TriageConfig, d Daemon, deps Deps) (*Worker, error) {
	b := newBuilder(t, d, deps)
	src, err := b.source()
	if err != nil {
		return nil, err
	}
	return b.worker(src)
}

// HandFed builds a worker for mails fed by hand without a config file
// (`gpuhost triage mail --eml FILE` against a running daemon): tc is the
// triage: section (config.DefaultTriage with the model filled in), the
// classifier and transcriber run on deps.ManagedBaseURL (the daemon's /v1),
// and there is no mailbox and, unless tc enables one, no sink: the result is
// only returned. stateDir is a scratch directory (the worker reads its
// checkpoint there; manual mails never move it).
func HandFed(tc config.TriageConfig, stateDir string, deps Deps) (*Worker, error) {
	if deps.ManagedBaseURL == "" {
		return nil, errors.New("triage: a hand-fed worker needs the daemon's /v1 (Deps.ManagedBaseURL)")
	}
	b := newBuilder(tc, Daemon{StateDir: stateDir}, deps)
	b.handFed = true
	return b.worker(noMailbox{})
}

// newBuilder fills in the defaults of deps.
func newBuilder(t config.TriageConfig, d Daemon, deps Deps) *builder {
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.LookupEnv == nil {
		deps.LookupEnv = os.LookupEnv
	}
	return &builder{t: t, d: d, deps: deps, log: deps.Log}
}

// worker builds everything but the source and the worker on src, which it
// closes on failure.
func (b *builder) worker(src source.Source) (*Worker, error) {
	t, d, deps := b.t, b.d, b.deps
	b.warnRules()
	ok := false
	defer func() {
		if !ok {
			_ = src.Close()
		}
	}()
	ep, err := b.modelEndpoint()
	if err != nil {
		return nil, err
	}
	cls, err := b.classifier(ep)
	if err != nil {
		return nil, err
	}
	tr, trLocal, err := b.transcriber(ep)
	if err != nil {
		return nil, err
	}
	customers, err := b.customers()
	if err != nil {
		return nil, err
	}
	sinks, err := b.sinks()
	if err != nil {
		return nil, err
	}
	w, err := New(Options{
		Source:            src,
		Classifier:        cls,
		ClassifierLocal:   ep.local,
		Transcriber:       tr,
		TranscriberLocal:  trLocal,
		Customers:         customers,
		Sinks:             sinks,
		Rules:             Rules{PriorityMailboxes: t.Rules.PriorityMailboxes, InternalDomains: t.Rules.InternalDomains, AuthservID: t.Rules.AuthservID, TrustFromHeader: t.Rules.TrustFromHeader},
		Threshold:         t.ImportantThreshold,
		StateDir:          d.StateDir,
		Clock:             deps.Clock,
		Power:             deps.Power,
		Prices:            t.Costs,
		Log:               b.log,
		MaxMessageBytes:   t.MaxMessageBytes,
		MaxAudioBytes:     t.Transcription.MaxBytes,
		MaxTranscriptions: t.Transcription.MaxPerMail,
		MaxAudioSeconds:   float64(t.Transcription.MaxSecondsPerMail),
		Rebaseline:        t.Rebaseline == nil || *t.Rebaseline,
		StartAtEnd:        t.FirstRun != "all",
		Interval:          t.Interval.D(),
		AlertFailures:     t.Alerting.FailuresBeforeAlert,
		RemindEvery:       t.Alerting.RemindEvery.D(),
		KeepResults:       t.KeepResults,
	})
	if err != nil {
		return nil, err
	}
	ok = true
	return w, nil
}

// builder holds what every section of FromConfig reads: the triage:
// section, the daemon's facts and pieces (defaults filled in) and the log.
type builder struct {
	t    config.TriageConfig
	d    Daemon
	deps Deps
	log  *slog.Logger
	// handFed: no mailbox, results only returned (HandFed).
	handFed bool
}

// env reads a secret from the environment variable name; key is the
// config key that names the variable, for the error.
func (b *builder) env(key, name string) (string, error) {
	v, ok := b.deps.LookupEnv(name)
	if !ok || strings.TrimSpace(v) == "" {
		return "", fmt.Errorf("%s: environment variable %s is not set", key, name)
	}
	return strings.TrimSpace(v), nil
}

// optEnv is env for an optional variable: no name, no secret.
func (b *builder) optEnv(key, name string) (string, error) {
	if name == "" {
		return "", nil
	}
	return b.env(key, name)
}

// source builds the mail source (triage.source).
func (b *builder) source() (source.Source, error) {
	t := b.t
	switch t.Source.Kind {
	case "maildir":
		md, err := source.NewMaildir(t.Source.Maildir)
		if err != nil {
			return nil, fmt.Errorf("triage.source.maildir: %w", err)
		}
		return md, nil
	case "imap":
		password := func() (string, error) {
			if t.Source.PasswordFile != "" {
				data, err := os.ReadFile(t.Source.PasswordFile)
				if err != nil {
					return "", fmt.Errorf("triage.source.password_file: read %s: %w", t.Source.PasswordFile, err)
				}
				return strings.TrimSpace(string(data)), nil
			}
			return b.env("triage.source.password_env", t.Source.PasswordEnv)
		}
		if _, err := password(); err != nil {
			return nil, err
		}
		if t.Source.InsecureSkipVerify {
			b.log.Warn("triage: triage.source.insecure_skip_verify is on: the IMAP server's TLS certificate is not verified, so anyone on the path can read the mailbox password and the mail",
				"addr", t.Source.Addr)
		}
		return source.NewIMAP(source.IMAPOptions{
			Addr:               t.Source.Addr,
			Security:           t.Source.Security,
			Username:           t.Source.Username,
			Password:           password,
			Mailbox:            t.Source.Mailbox,
			InsecureSkipVerify: t.Source.InsecureSkipVerify,
			Timeout:            t.Source.Timeout.D(),
			Log:                b.log.With("source", "imap"),
		}), nil
	default:
		return nil, fmt.Errorf("triage.source.kind: %q is not imap or maildir", t.Source.Kind)
	}
}

// warnRules warns about triage.rules settings that do not do what they
// seem to.
func (b *builder) warnRules() {
	r := b.t.Rules
	if len(r.InternalDomains) > 0 && r.AuthservID == "" && !r.TrustFromHeader {
		b.log.Warn("triage: triage.rules.internal_domains is set without triage.rules.authserv_id: the internal-sender rule never fires (set the receiving server's authserv-id, or trust_from_header: true to trust the forgeable From header)")
	}
	if r.TrustFromHeader {
		b.log.Warn("triage: triage.rules.trust_from_header is on: any external sender can claim an internal From address to get importance 1 and skip the CRM lookup")
	}
}

// endpoint is the OpenAI-compatible server the classifier (and, by
// default, the transcriber) calls.
type endpoint struct {
	baseURL string
	local   bool // the daemon's own endpoint: the managed model
	apiKey  string
}

// modelEndpoint resolves triage.model.base_url (empty: the daemon's own
// endpoint) and its API key.
func (b *builder) modelEndpoint() (endpoint, error) {
	t := b.t
	ep := endpoint{baseURL: t.Model.BaseURL, local: t.Model.BaseURL == ""}
	if ep.local {
		ep.baseURL = b.deps.ManagedBaseURL
		if ep.baseURL == "" {
			var err error
			if ep.baseURL, err = ManagedURL(b.d.Listen); err != nil {
				return ep, fmt.Errorf("triage.model.base_url is empty, so the daemon's endpoint is used, but %w", err)
			}
		}
	}
	var err error
	ep.apiKey, err = b.optEnv("triage.model.api_key_env", t.Model.APIKeyEnv)
	return ep, err
}

// classifier builds the classification model (triage.model): a fixed
// model, or the one the managed endpoint serves now.
func (b *builder) classifier(ep endpoint) (Classifier, error) {
	t := b.t
	mkClassifier := func(model string) (*llm.Classifier, error) {
		return llm.NewClassifier(llm.ClassifierOptions{
			BaseURL: ep.baseURL, Model: model, APIKey: ep.apiKey,
			HTTPClient: b.deps.HTTPClient, Timeout: t.Model.Timeout.D(), Logger: b.log,
		})
	}
	if t.Model.Model != "" {
		c, err := mkClassifier(t.Model.Model)
		if err != nil {
			return nil, fmt.Errorf("triage.model: %w", err)
		}
		return c, nil
	}
	active := b.deps.ActiveModel
	if active == nil {
		name := b.d.DefaultModel
		if name == "" {
			return nil, errors.New("triage.model.model: not set, and there is no default_profile whose served name could stand in")
		}
		active = func() string { return name }
	}
	return &activeClassifier{model: active, build: mkClassifier}, nil
}

// transcriber builds the voice memo transcriber (triage.transcription;
// nil when disabled) and says whether it runs on the managed endpoint.
func (b *builder) transcriber(ep endpoint) (Transcriber, bool, error) {
	tc := b.t.Transcription
	if tc.Disabled {
		return nil, false, nil
	}
	tbase, tkey, trLocal := tc.BaseURL, "", false
	var err error
	switch {
	case tbase != "":
		if tkey, err = b.optEnv("triage.transcription.api_key_env", tc.APIKeyEnv); err != nil {
			return nil, false, err
		}
	default:
		tbase, trLocal = ep.baseURL, ep.local
		tkey = ep.apiKey
		if tc.APIKeyEnv != "" {
			if tkey, err = b.env("triage.transcription.api_key_env", tc.APIKeyEnv); err != nil {
				return nil, false, err
			}
		}
	}
	x, err := llm.NewTranscriber(llm.TranscriberOptions{
		BaseURL: tbase, Model: tc.Model, APIKey: tkey,
		HTTPClient: b.deps.HTTPClient, Timeout: tc.Timeout.D(), MaxBytes: tc.MaxBytes,
	})
	if err != nil {
		return nil, false, fmt.Errorf("triage.transcription: %w", err)
	}
	return x, trLocal, nil
}

// customers builds the CRM lookup (triage.crm; nil when disabled).
func (b *builder) customers() (Customers, error) {
	c := b.t.CRM
	if !c.Enabled {
		return nil, nil
	}
	if b.deps.MCP == nil {
		return nil, errors.New("triage.crm.enabled: no MCP client for the crm connector (enable mcp.connectors.crm)")
	}
	return &customer.Lookup{Client: b.deps.MCP, Tool: c.Tool, ProfileURL: c.ProfileURL, Match: c.Match}, nil
}

// sinks builds the enabled sinks: triage.slack, triage.telegram,
// triage.console, in that order.
func (b *builder) sinks() ([]sink.Sink, error) {
	t := b.t
	var sinks []sink.Sink
	if t.Slack.Enabled {
		s, err := b.slackSink()
		if err != nil {
			return nil, err
		}
		sinks = append(sinks, s)
	}
	if t.Telegram.Enabled {
		s, err := b.telegramSink()
		if err != nil {
			return nil, err
		}
		sinks = append(sinks, s)
	}
	if t.Console {
		out := b.deps.Stdout
		if out == nil {
			out = os.Stdout
		}
		sinks = append(sinks, sink.NewConsole(out))
	}
	if len(sinks) == 0 && !b.handFed {
		b.log.Warn("triage: no sink is enabled (triage.slack / triage.telegram / triage.console); results only reach the log and GET /api/triage")
	}
	return sinks, nil
}

// slackSink builds the triage.slack sink; its token is read now (to fail
// early) and at every call.
func (b *builder) slackSink() (*sink.Slack, error) {
	sc := b.t.Slack
	tokenEnv := sc.TokenEnv
	token := func() (string, error) { return b.env("triage.slack.token_env", tokenEnv) }
	if _, err := token(); err != nil {
		return nil, err
	}
	s, err := sink.NewSlack(sink.SlackOptions{
		Token: token, TokenSource: "environment variable " + tokenEnv,
		APIURL: sc.APIURL, Channel: sc.Channel,
		ImportantChannel: sc.ImportantChannel, HTTPClient: b.deps.HTTPClient,
		Log: b.log,
	})
	if err != nil {
		return nil, fmt.Errorf("triage.slack: %w", err)
	}
	return s, nil
}

// telegramSink builds the triage.telegram sink on the telegram: bot's
// token (file or variable), read now (to fail early) and at every call.
func (b *builder) telegramSink() (*sink.Telegram, error) {
	tc := b.d.Telegram
	tokenSource := "environment variable " + tc.TokenEnv
	if tc.TokenFile != "" {
		tokenSource = "telegram.token_file " + tc.TokenFile
	}
	token := func() (string, error) {
		if tc.TokenFile != "" {
			data, err := os.ReadFile(tc.TokenFile)
			if err != nil {
				return "", fmt.Errorf("telegram.token_file: read %s: %w", tc.TokenFile, err)
			}
			return strings.TrimSpace(string(data)), nil
		}
		return b.env("telegram.token_env", tc.TokenEnv)
	}
	if _, err := token(); err != nil {
		return nil, fmt.Errorf("triage.telegram needs the bot token: %w", err)
	}
	s, err := sink.NewTelegram(sink.TelegramOptions{
		Token: token, TokenSource: tokenSource,
		APIURL: tc.APIURL, StateDir: b.d.StateDir,
		ImportantOnly: b.t.Telegram.ImportantOnly, HTTPClient: b.deps.HTTPClient,
		Log: b.log,
	})
	if err != nil {
		return nil, fmt.Errorf("triage.telegram: %w", err)
	}
	return s, nil
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

// noMailbox is a hand-fed worker's source: there is no mailbox to poll or
// fetch from.
type noMailbox struct{}

var errNoMailbox = errors.New("no mailbox: this worker only takes mails fed by hand (--eml); polling and --uid need the triage: section of a config file")

func (noMailbox) Fetch(context.Context, uint32, int, int64) (source.Batch, error) {
	return source.Batch{}, errNoMailbox
}

func (noMailbox) Get(context.Context, uint32, int64) (source.Mail, error) {
	return source.Mail{}, errNoMailbox
}

func (noMailbox) Wait(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func (noMailbox) Name() string { return "hand-fed" }
func (noMailbox) Close() error { return nil }
