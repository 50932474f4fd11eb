package config

import (
	"fmt"
	"net"
	"strings"
	"time"

	"gpuhost/internal/loopback"
)

// TriageConfig is the `triage:` section: the mail triage worker hosted by
// `gpuhost serve` when enabled, and run on its own by `gpuhost triage`.
type TriageConfig struct {
	Enabled bool `yaml:"enabled"`
	// Interval between polls (default 60s); IMAP IDLE wakes it earlier.
	Interval Duration           `yaml:"interval"`
	Source   TriageSourceConfig `yaml:"source"`
	// Model is the classification endpoint; empty base_url means the
	// daemon's own managed /v1 endpoint.
	Model         TriageModelConfig         `yaml:"model"`
	Transcription TriageTranscriptionConfig `yaml:"transcription"`
	Rules         TriageRulesConfig         `yaml:"rules"`
	CRM           TriageCRMConfig           `yaml:"crm"`
	Slack         TriageSlackConfig         `yaml:"slack"`
	Telegram      TriageTelegramConfig      `yaml:"telegram"`
	Costs         TriageCostsConfig         `yaml:"costs"`
	Alerting      TriageAlertingConfig      `yaml:"alerting"`
	// ImportantThreshold: importance at or above it also goes to the
	// important channels (default 7).
	ImportantThreshold int `yaml:"important_threshold"`
	// MaxMessageBytes: a mail larger than this is processed from its
	// headers only, with the reason in the post (default 30 MiB).
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
	// Rebaseline: on a UIDVALIDITY change, start after the mailbox's current
	// highest UID instead of reprocessing every mail (default true).
	Rebaseline *bool `yaml:"rebaseline_on_uidvalidity"`
	// FirstRun decides where a mailbox without a checkpoint starts: "new"
	// (default) after its current highest UID, so connecting a mailbox does
	// not post its whole history (older mails: `gpuhost triage mail --uid`);
	// "all" from the first mail (the demo's sample mailbox).
	FirstRun string `yaml:"first_run"`
	// KeepResults is how many recent results GET /api/triage returns (default 100).
	KeepResults int `yaml:"keep_results"`
	// Console prints every post to standard output as well (the demo's
	// team chat; also handy with `gpuhost triage run` in a terminal).
	Console bool `yaml:"console"`
}

// TriageSourceConfig says where mail comes from.
type TriageSourceConfig struct {
	Kind    string `yaml:"kind"`    // imap | maildir
	Maildir string `yaml:"maildir"` // kind maildir: a Maildir folder (cur/ new/)
	// IMAP: Addr host:port; Security tls | starttls | plain (plain only to
	// a loopback address).
	Addr         string `yaml:"addr"`
	Security     string `yaml:"security"`
	Username     string `yaml:"username"`
	PasswordEnv  string `yaml:"password_env"`
	PasswordFile string `yaml:"password_file"`
	Mailbox      string `yaml:"mailbox"` // default INBOX
	// InsecureSkipVerify only for a self-signed server you trust.
	InsecureSkipVerify bool     `yaml:"insecure_skip_verify"`
	Timeout            Duration `yaml:"timeout"` // per IMAP command (default 30s)
}

// TriageModelConfig is an OpenAI-compatible chat endpoint for classification.
type TriageModelConfig struct {
	BaseURL   string   `yaml:"base_url"`    // default: the daemon's /v1
	Model     string   `yaml:"model"`       // default: the active profile's served name
	APIKeyEnv string   `yaml:"api_key_env"` // optional
	Timeout   Duration `yaml:"timeout"`     // default 120s
}

// TriageTranscriptionConfig is an OpenAI-compatible /v1/audio/transcriptions.
type TriageTranscriptionConfig struct {
	Disabled  bool     `yaml:"disabled"`
	BaseURL   string   `yaml:"base_url"` // default: the classification endpoint
	Model     string   `yaml:"model"`    // default whisper-1
	APIKeyEnv string   `yaml:"api_key_env"`
	MaxBytes  int64    `yaml:"max_bytes"` // default 24 MiB (the form stays under OpenAI's 25 MiB)
	Timeout   Duration `yaml:"timeout"`   // default 300s
	// MaxPerMail bounds the transcription calls of one mail (default 10);
	// MaxSecondsPerMail the audio seconds transcribed for one mail
	// (default 900: 15 minutes). Once either is reached the mail's other
	// audio attachments are not transcribed, and the post names them. The
	// seconds are known only from each transcription's reply, so the last
	// attachment transcribed may run past the seconds cap (by at most one
	// attachment, itself bounded by max_bytes).
	MaxPerMail        int `yaml:"max_per_mail"`
	MaxSecondsPerMail int `yaml:"max_seconds_per_mail"`
}

// TriageRulesConfig are the deterministic importance overrides.
type TriageRulesConfig struct {
	// PriorityMailboxes: mail addressed to one of these (To, Cc,
	// Delivered-To, X-Original-To) gets importance 10.
	PriorityMailboxes []string `yaml:"priority_mailboxes"`
	// InternalDomains: a sender in one of these domains gets importance 1
	// and is not looked up in the CRM — only when the receiving server's
	// Authentication-Results (authserv_id) shows dmarc, dkim or spf
	// passing for the domain, or with trust_from_header.
	InternalDomains []string `yaml:"internal_domains"`
	// AuthservID is the authserv-id the receiving mail server writes in
	// its Authentication-Results header (e.g. mx.example.com).
	AuthservID string `yaml:"authserv_id"`
	// TrustFromHeader applies the internal-sender rule on the From header
	// alone, which any external sender can forge.
	TrustFromHeader bool `yaml:"trust_from_header"`
}

// TriageCRMConfig: external senders are looked up through the MCP crm
// connector's read-only search template.
type TriageCRMConfig struct {
	Enabled bool   `yaml:"enabled"`
	Tool    string `yaml:"tool"` // default crm_search_users
	// ProfileURL is the customer link; {id} is replaced by the user id.
	ProfileURL string `yaml:"profile_url"`
	// Match is how Tool compares its query: "like" (default; the
	// substring template crm_search_users: the address goes with %, _ and
	// \ escaped) or "equal" (a template with lower(email) = lower($1)).
	Match string `yaml:"match"`
}

// TriageSlackConfig posts with chat.postMessage.
type TriageSlackConfig struct {
	Enabled          bool   `yaml:"enabled"`
	TokenEnv         string `yaml:"token_env"` // default SLACK_BOT_TOKEN
	APIURL           string `yaml:"api_url"`   // tests point it at a fake
	Channel          string `yaml:"channel"`
	ImportantChannel string `yaml:"important_channel"`
}

// TriageTelegramConfig posts through the daemon's bot to allowlisted chats.
type TriageTelegramConfig struct {
	Enabled bool `yaml:"enabled"`
	// ImportantOnly sends only mails at or above the threshold.
	ImportantOnly bool `yaml:"important_only"`
}

// TriageCostsConfig prices every mail.
type TriageCostsConfig struct {
	Currency string `yaml:"currency"` // default USD
	// Models maps a model name to its token prices.
	Models map[string]ModelPrice `yaml:"models"`
	// TranscriptionPerMinute is the price of one audio minute.
	TranscriptionPerMinute float64 `yaml:"transcription_per_minute"`
	// EnergyPerKWh prices local inference by NVML power × duration.
	EnergyPerKWh float64 `yaml:"energy_per_kwh"`
}

// ModelPrice is a price per million tokens.
type ModelPrice struct {
	PromptPerMillion     float64 `yaml:"prompt_per_million"`
	CompletionPerMillion float64 `yaml:"completion_per_million"`
}

// TriageAlertingConfig: alert after FailuresBeforeAlert consecutive poll
// failures (default 3), remind every RemindEvery (default 6h).
type TriageAlertingConfig struct {
	FailuresBeforeAlert int      `yaml:"failures_before_alert"`
	RemindEvery         Duration `yaml:"remind_every"`
}

// DefaultTriage is the triage: section with every default filled in, for a
// worker without a config file (`gpuhost triage mail --eml` against a
// running daemon).
func DefaultTriage() TriageConfig {
	var c Config
	c.triageDefaults()
	return c.Triage
}

// triageDefaults fills in the triage: section.
func (c *Config) triageDefaults() {
	t := &c.Triage
	if t.Interval == 0 {
		t.Interval = Duration(60 * time.Second)
	}
	if t.Source.Mailbox == "" {
		t.Source.Mailbox = "INBOX"
	}
	if t.Source.Security == "" {
		t.Source.Security = "tls"
	}
	if t.Source.Timeout == 0 {
		t.Source.Timeout = Duration(30 * time.Second)
	}
	if t.Model.Timeout == 0 {
		t.Model.Timeout = Duration(120 * time.Second)
	}
	if t.Transcription.Model == "" {
		t.Transcription.Model = "whisper-1"
	}
	if t.Transcription.MaxBytes == 0 {
		t.Transcription.MaxBytes = 24 << 20 // the multipart form must stay under OpenAI's 25 MiB
	}
	if t.Transcription.Timeout == 0 {
		t.Transcription.Timeout = Duration(300 * time.Second)
	}
	if t.Transcription.MaxPerMail == 0 {
		t.Transcription.MaxPerMail = 10
	}
	if t.Transcription.MaxSecondsPerMail == 0 {
		t.Transcription.MaxSecondsPerMail = 900
	}
	if t.CRM.Tool == "" {
		t.CRM.Tool = "crm_search_users"
	}
	if t.Slack.TokenEnv == "" {
		t.Slack.TokenEnv = "SLACK_BOT_TOKEN"
	}
	if t.Costs.Currency == "" {
		t.Costs.Currency = "USD"
	}
	if t.Alerting.FailuresBeforeAlert == 0 {
		t.Alerting.FailuresBeforeAlert = 3
	}
	if t.Alerting.RemindEvery == 0 {
		t.Alerting.RemindEvery = Duration(6 * time.Hour)
	}
	if t.ImportantThreshold == 0 {
		t.ImportantThreshold = 7
	}
	if t.MaxMessageBytes == 0 {
		t.MaxMessageBytes = 30 << 20
	}
	if t.Rebaseline == nil {
		v := true
		t.Rebaseline = &v
	}
	if t.FirstRun == "" {
		t.FirstRun = "new"
	}
	if t.KeepResults == 0 {
		t.KeepResults = 100
	}
}

// triageValidate checks the triage: section.
func (c *Config) triageValidate(add func(key, format string, args ...any)) {
	t := c.Triage
	checkHTTPURL(add, "triage.model.base_url", t.Model.BaseURL)
	checkHTTPURL(add, "triage.transcription.base_url", t.Transcription.BaseURL)
	checkHTTPURL(add, "triage.slack.api_url", t.Slack.APIURL)
	if t.ImportantThreshold < 1 || t.ImportantThreshold > 10 {
		add("triage.important_threshold", "%d is not in 1..10", t.ImportantThreshold)
	}
	for i, m := range t.Rules.PriorityMailboxes {
		if !strings.Contains(m, "@") {
			add(fmt.Sprintf("triage.rules.priority_mailboxes[%d]", i), "%q is not an address", m)
		}
	}
	for i, d := range t.Rules.InternalDomains {
		if d == "" || strings.ContainsAny(d, "@ /") {
			add(fmt.Sprintf("triage.rules.internal_domains[%d]", i), "%q is not a domain", d)
		}
	}
	if t.Transcription.MaxBytes < 0 {
		add("triage.transcription.max_bytes", "must not be negative")
	}
	if t.Transcription.MaxPerMail < 0 {
		add("triage.transcription.max_per_mail", "%d is negative (0 means the default, 10)", t.Transcription.MaxPerMail)
	}
	if t.Transcription.MaxSecondsPerMail < 0 {
		add("triage.transcription.max_seconds_per_mail", "%d is negative (0 means the default, 900)", t.Transcription.MaxSecondsPerMail)
	}
	if t.FirstRun != "new" && t.FirstRun != "all" {
		add("triage.first_run", "%q is not new or all", t.FirstRun)
	}
	if t.Alerting.FailuresBeforeAlert < 1 {
		add("triage.alerting.failures_before_alert", "must be at least 1")
	}
	if t.CRM.ProfileURL != "" && !strings.Contains(t.CRM.ProfileURL, "{id}") {
		add("triage.crm.profile_url", "%q has no {id} placeholder", t.CRM.ProfileURL)
	}
	switch t.CRM.Match {
	case "", "like", "equal":
	default:
		add("triage.crm.match", "%q is neither like nor equal", t.CRM.Match)
	}
	if !t.Enabled {
		return
	}
	switch t.Source.Kind {
	case "maildir":
		if t.Source.Maildir == "" {
			add("triage.source.maildir", "required when triage.source.kind is maildir")
		}
	case "imap":
		host, _, err := net.SplitHostPort(t.Source.Addr)
		if err != nil {
			add("triage.source.addr", "%q is not host:port", t.Source.Addr)
		}
		switch t.Source.Security {
		case "tls", "starttls":
		case "plain":
			if !loopback.DialsLoopback(host) {
				add("triage.source.security", "plain (no TLS) is allowed only to a loopback address, not %q", host)
			}
		default:
			add("triage.source.security", "%q is not tls, starttls or plain", t.Source.Security)
		}
		if t.Source.Username == "" {
			add("triage.source.username", "required for IMAP")
		}
		if t.Source.PasswordEnv == "" && t.Source.PasswordFile == "" {
			add("triage.source.password_env", "set password_env or password_file")
		}
	default:
		add("triage.source.kind", "%q is not imap or maildir", t.Source.Kind)
	}
	if t.Slack.Enabled && t.Slack.Channel == "" {
		add("triage.slack.channel", "required when triage.slack.enabled")
	}
}
