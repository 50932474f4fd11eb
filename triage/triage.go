// Package triage is the mail triage worker: it polls one mailbox and sends
// every new mail on its own through a fixed pipeline — parse, transcribe
// voice memos, classify on the model with a strict schema, let
// deterministic rules override the importance, find the unsubscribe link by
// code, look the sender up in the CRM, price the AI work, post to the team
// chat — and records after every mail how far it got, so that a crash
// neither loses nor repeats a mail.
//
// The worker speaks in small interfaces defined here (Classifier,
// Transcriber, Customers, Clock, Alerter); the subpackages implement them:
// triage/source (IMAP, Maildir), triage/mail (MIME), triage/llm (the
// OpenAI-compatible endpoint), triage/unsubscribe, triage/customer (the MCP
// crm connector) and triage/sink (Slack, Telegram). FromConfig wires them
// from gpuhost.yaml; tests swap in real pieces or fakes of cloud APIs.
//
// Decisions the code makes (and the tests hold):
//   - A mail to a priority mailbox gets importance 10 even when the sender is
//     internal: an escalation to the priority address is exactly what the
//     address is for, and missing one costs more than one loud post. The
//     internal-sender rule (importance 1) applies otherwise; internal
//     senders are never looked up in the CRM.
//   - The List-Unsubscribe header is shown for every mail that carries it
//     (it is a fact, not a guess); the HTML fallback is searched only for
//     mails the model classed promotional or other, because an anchor in a
//     customer's quoted newsletter is a wrong link, and a wrong link is worse
//     than none.
//   - A model reply that stays invalid is posted as "unclassified" with the
//     reason, never dropped, at the important threshold (rule
//     RuleUnclassified): a mail nobody judged belongs where people look
//     first, and a broken model shows at once. An unreachable model
//     endpoint, sink or state
//     file stops the batch without moving the checkpoint, and the mail is
//     retried on the next poll.
//   - Every failed poll counts towards the alert, whether the fetch failed
//     or a mail could not be finished (model or chat down): either way mail
//     is waiting and someone should look.
package triage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"gpuhost/config"
	"gpuhost/triage/customer"
	"gpuhost/triage/llm"
	"gpuhost/triage/sink"
	"gpuhost/triage/source"
)

// Classifier judges one mail. triage/llm's *Classifier implements it; an
// *llm.UnclassifiedError means the model answered but not to the schema
// (the mail is posted as unclassified), any other error means the endpoint
// could not be asked (the mail is retried on the next poll).
type Classifier interface {
	Classify(ctx context.Context, in llm.Input) (llm.Classification, []llm.Usage, error)
}

// Transcriber turns one audio attachment into text. triage/llm's
// *Transcriber implements it. A failure never holds a mail back: the mail
// goes on without the transcript and the post says why.
type Transcriber interface {
	Transcribe(ctx context.Context, filename string, data []byte) (llm.Transcript, llm.Usage, error)
}

// Customers finds an external sender in the user database. triage/customer's
// *Lookup implements it; (nil, nil) means "not a customer".
type Customers interface {
	Find(ctx context.Context, email string) (*customer.Customer, error)
}

// Alerter is a sink that can carry a plain operator alert (poll failures,
// their reminders, the all-clear, a UIDVALIDITY re-baseline). It is optional
// so that sink.Sink stays one method; sinks without it leave the alert to
// the log.
type Alerter interface {
	Alert(ctx context.Context, text string) error
}

// ChannelAlerter is an Alerter with several destinations (Slack's main and
// important channels) that says which of them took an alert, so that the
// all-clear goes to exactly those: a channel that never got the alert
// must not get its all-clear.
type ChannelAlerter interface {
	Alerter
	AlertChannels() []string
	// AlertTo sends text to channels and returns those that took it; the
	// error names the ones that did not.
	AlertTo(ctx context.Context, text string, channels []string) (took []string, err error)
}

// Clock is the worker's time, injected so that tests can drive the
// alerting and the poll loop without sleeping.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// PowerFunc reports the GPU's current power draw (NVML), for the energy
// cost of local model calls; ok is false when no figure is available.
type PowerFunc func(ctx context.Context) (watts float64, ok bool)

// Rules are the deterministic importance overrides (docs/design.md decision 3,
// deterministic work is code): the model has nothing to decide about them.
type Rules struct {
	// PriorityMailboxes: mail addressed to one of these (To, Cc,
	// Delivered-To, X-Original-To) gets importance 10.
	PriorityMailboxes []string
	// InternalDomains: a sender in one of these domains (or a subdomain)
	// gets importance 1 and is not looked up in the CRM — only when the
	// receiving server's Authentication-Results (authserv-id AuthservID)
	// shows dmarc, dkim or spf passing for the internal domain, or when
	// TrustFromHeader is set. A From header alone proves nothing.
	InternalDomains []string
	// AuthservID is the authserv-id of the receiving mail server's
	// Authentication-Results header (e.g. mx.example.com).
	AuthservID string
	// TrustFromHeader applies the internal-sender rule on the From header
	// alone (the operator's explicit opt-out of the evidence check).
	TrustFromHeader bool
}

// Options configure a Worker. Source, Classifier and StateDir are required;
// the rest have defaults.
type Options struct {
	Source     source.Source
	Classifier Classifier
	// ClassifierLocal says the classifier runs on this box's GPU, so its
	// calls are priced by energy (Power × duration) as well.
	ClassifierLocal bool
	// Transcriber nil disables transcription (audio is then noted in the post).
	Transcriber      Transcriber
	TranscriberLocal bool
	// Customers nil disables the CRM lookup.
	Customers Customers
	// Sinks get every post, in order; a sink that also implements
	// sink.Checker is asked after a crash whether it already has the post,
	// one that implements Alerter carries the operator alerts.
	Sinks []sink.Sink
	Rules Rules
	// Threshold: importance at or above it marks the post important
	// (default 7).
	Threshold int
	// StateDir holds triage/<mailbox>.json, the checkpoint.
	StateDir string
	Clock    Clock
	Power    PowerFunc
	Prices   config.TriageCostsConfig
	Log      *slog.Logger
	// MaxMessageBytes: larger mails are fetched as headers only (default 30 MiB).
	MaxMessageBytes int64
	// MaxAudioBytes: larger audio attachments are not transcribed (default 25 MiB).
	MaxAudioBytes int64
	// MaxTranscriptions and MaxAudioSeconds bound one mail's transcription
	// (defaults 10 calls, 900 s): a mail with hundreds of tiny voice memos
	// must not make hundreds of paid calls.
	MaxTranscriptions int
	MaxAudioSeconds   float64
	// Rebaseline: on a UIDVALIDITY change continue after the mailbox's
	// current highest UID instead of reprocessing it whole.
	Rebaseline bool
	// StartAtEnd: on the first poll of a mailbox without a checkpoint,
	// start after its current highest UID (config first_run: new) instead
	// of triaging every mail already in it.
	StartAtEnd bool
	// Interval between polls (default 60s).
	Interval time.Duration
	// AlertFailures consecutive failed polls raise the alert (default 3);
	// RemindEvery repeats it while failing (default 6h).
	AlertFailures int
	RemindEvery   time.Duration
	// KeepResults is how many recent results Recent returns (default 100).
	KeepResults int
	// BatchSize is how many mails one Fetch returns at most (default 50).
	BatchSize int
	// CallTimeout bounds one CRM lookup, sink post or sink check
	// (default 2 minutes); model calls carry their own timeouts.
	CallTimeout time.Duration
}

// Worker is one mailbox's triage. Its methods are safe for concurrent use;
// mails are processed one at a time.
type Worker struct {
	o    Options
	log  *slog.Logger
	name string // the source's mailbox name
	path string // the checkpoint file

	mu sync.Mutex // serialises processing and the checkpoint
	st Checkpoint

	smu     sync.Mutex // guards what the API reads
	recent  []Result
	status  Status
	alert   AlertState // w.st.Alert once saved; guarded by smu
	metrics *metrics
	// hold is, by sink name, the time before which the sink's service
	// asked not to be called again (Retry-After); guarded by smu.
	hold map[string]time.Time
}

// New checks the options, reads the mailbox's checkpoint and returns a
// worker that has not polled yet. A checkpoint file that cannot be read is
// an error: guessing a position would either repeat or skip mail.
func New(o Options) (*Worker, error) {
	switch {
	case o.Source == nil:
		return nil, errors.New("triage: no mail source")
	case o.Classifier == nil:
		return nil, errors.New("triage: no classifier")
	case o.StateDir == "":
		return nil, errors.New("triage: no state directory for the checkpoint")
	}
	if o.Threshold <= 0 {
		o.Threshold = 7
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = 30 << 20
	}
	if o.MaxAudioBytes <= 0 {
		o.MaxAudioBytes = 25 << 20
	}
	if o.MaxTranscriptions <= 0 {
		o.MaxTranscriptions = 10
	}
	if o.MaxAudioSeconds <= 0 {
		o.MaxAudioSeconds = 900
	}
	if o.Interval <= 0 {
		o.Interval = 60 * time.Second
	}
	if o.AlertFailures <= 0 {
		o.AlertFailures = 3
	}
	if o.RemindEvery <= 0 {
		o.RemindEvery = 6 * time.Hour
	}
	if o.KeepResults <= 0 {
		o.KeepResults = 100
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 50
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 2 * time.Minute
	}
	if o.Prices.Currency == "" {
		o.Prices.Currency = "USD"
	}
	seen := map[string]bool{}
	for i, s := range o.Sinks {
		if s == nil {
			return nil, fmt.Errorf("triage: sink %d is nil", i)
		}
		if seen[s.Name()] {
			return nil, fmt.Errorf("triage: two sinks are named %q; the checkpoint tells them apart by name", s.Name())
		}
		seen[s.Name()] = true
	}
	name := o.Source.Name()
	w := &Worker{
		o:       o,
		name:    name,
		log:     o.Log.With("mailbox", name),
		path:    checkpointPath(o.StateDir, name),
		metrics: newMetrics(o.Prices.Currency),
	}
	st, err := loadCheckpoint(w.path)
	if err != nil {
		return nil, err
	}
	w.st = st
	w.status.Checkpoint = st
	if st.Alert != nil {
		w.alert = st.Alert.clone()
		w.status.LastAlert = st.Alert.LastAlert
		if st.Alert.Alerted {
			w.log.Warn("triage: the last run stopped while mail was not being processed; the all-clear follows the next successful poll",
				"failed_polls", st.Alert.Failures, "since", st.Alert.FirstFail, "alerted", st.Alert.Told)
		}
	}
	w.metrics.checkpoint.Set(float64(st.LastUID))
	switch in := st.Inflight; {
	case in == nil:
	case in.Judged == nil && len(in.Calls) > 0:
		w.log.Warn("triage: the last run stopped while judging a mail; the calls it recorded are reused, an interrupted one is made again and counted as a repeat",
			"key", in.Key, "since", in.Since, "calls", len(in.Calls))
	default:
		w.log.Warn("triage: the last run stopped while posting a mail; it is checked against the sinks before it is posted again",
			"key", in.Key, "since", in.Since, "posted_to", strings.Join(in.Posted, ","))
	}
	return w, nil
}

// Close closes the mail source.
func (w *Worker) Close() error { return w.o.Source.Close() }

// Name is the mailbox the worker reads, as in keys and logs.
func (w *Worker) Name() string { return w.name }

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
