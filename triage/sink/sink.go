// Package sink delivers a triage result to the team chat: Slack
// (github.com/slack-go/slack, chat.postMessage with blocks), Telegram (the
// daemon's bot token, allowlisted chats) and the console (plain text to a
// writer, for the demo and a terminal). Each also carries the worker's
// operator alerts (an Alert method, triage.Alerter).
package sink

import "context"

// Post is one triaged mail, formatted by each sink.
type Post struct {
	// Key identifies the mail across restarts: "<mailbox>/<uidvalidity>/<uid>".
	// Sinks embed it so a post can be found again (Slack history check).
	Key       string
	Important bool // importance >= threshold: also to the important channel
	From      string
	Subject   string
	// Class is the contact type, or "unclassified" with Unclassified the reason.
	Class        string
	Unclassified string
	Real         bool
	Importance   int
	Rule         string // the rule that set the importance, "" = the model
	Reasoning    string
	Transcript   string // excerpt
	// TranscriptNote explains a missing transcript ("transcription failed: …").
	TranscriptNote string
	Unsubscribe    string
	OneClick       bool
	CustomerName   string
	CustomerURL    string
	Cost           string // footer, e.g. "0.0021 USD · 412+38 tok · 1.9 Wh"
	Problems       []string
}

// Sink delivers posts.
type Sink interface {
	Name() string
	Post(ctx context.Context, p Post) error
}

// Checker is a sink that can tell whether a post with this key already
// reached it (used after a crash for mails whose in-flight marker is set).
type Checker interface {
	Posted(ctx context.Context, key string) (bool, error)
}
