package api

import (
	"errors"
	"time"
)

// The triage worker as the panel's Mail page shows it: plain values, so a
// front door reads the worker without linking it.

// ErrMailNotFound is wrapped by the triage worker's RerunMail for a UID
// the mailbox lacks.
var ErrMailNotFound = errors.New("no such mail")

// MailStatus is the worker's polling, alert and checkpoint state.
type MailStatus struct {
	Mailbox             string
	LastPoll            time.Time
	LastPollOK          time.Time
	LastError           string
	ConsecutiveFailures int
	Alerting            bool
	// FailingSince is the first failed poll of the current run of
	// failures; LastAlert the last alert sent about them; LastAllClear the
	// last "polling works again".
	FailingSince time.Time
	LastAlert    time.Time
	LastAllClear time.Time
	Processed    int
	// The checkpoint: how far the mailbox is triaged.
	UIDValidity uint32
	LastUID     uint32
	Written     time.Time
	// Inflight is a mail being posted (nil: none).
	Inflight *MailInflight
	// Days is the AI cost per UTC day, oldest first.
	Days []MailDay
}

// MailInflight is a mail whose posting is under way.
type MailInflight struct {
	UID    uint32
	Since  time.Time
	Posted []string // the sinks that already have it
}

// MailDay is one UTC day's AI cost, the amounts formatted in its currency
// as the posts' footers print them.
type MailDay struct {
	Day                         string // 2006-01-02
	Mails                       int
	Total, Model, Audio, Energy string
	EnergyWh                    float64
	// Calls are the model and transcription calls of the day's mails;
	// Repeats those made again because a crash lost their reply.
	Calls, Repeats int
}

// MailPost is one judged mail as the page shows it. URLs come as the mail
// or the CRM gave them; the page decides which are safe to link.
type MailPost struct {
	At             time.Time
	Key            string
	UID            uint32
	Manual, DryRun bool
	From, Subject  string
	Class          string
	// Unclassified says why the model's answer was not used ("" when it
	// was).
	Unclassified    string
	Importance      int
	ModelImportance int
	// Overridden: a rule changed the model's importance (named by Rule).
	Overridden bool
	Rule       string
	Important  bool
	// UnsubscribeURL and UnsubscribeMailto are the mail's unsubscribe
	// links; OneClick marks RFC 8058 one-click.
	UnsubscribeURL, UnsubscribeMailto string
	OneClick                          bool
	CustomerName, CustomerURL         string
	// Cost is the total in the result's currency, CostDetail the post's
	// footer (model, audio, energy, tokens).
	Cost, CostDetail string
	Posted           []string // sinks that have it (from this run or one that crashed)
	Problems         int
	// Text is the post as the chat gets it, without the transcript
	// excerpt (the panel never shows a transcript); TranscriptLeftOut
	// says one was there.
	Text              string
	TranscriptLeftOut bool
}
