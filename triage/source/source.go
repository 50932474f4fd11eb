// Package source is where the triage worker's mail comes from: an IMAP
// mailbox (github.com/emersion/go-imap/v2) or a Maildir folder (the demo's
// and the tests'). Both speak in UIDs and UIDVALIDITY, so the worker's
// checkpoint means the same for either.
package source

import (
	"context"
	"errors"
	"time"
)

// Mail is one fetched message.
type Mail struct {
	UID  uint32
	Size int64 // RFC822.SIZE
	// Raw is the whole message, or only its header block when HeaderOnly
	// (the message is larger than the fetch limit).
	Raw        []byte
	HeaderOnly bool
}

// Batch is the result of one poll.
type Batch struct {
	UIDValidity uint32
	// HighestUID is the highest UID in the mailbox now (UIDNEXT-1 or the
	// last message's), used to re-baseline after a UIDVALIDITY change.
	HighestUID uint32
	Mails      []Mail // UID > after, ascending
}

// ErrNotFound is returned by Get for a UID the mailbox does not hold.
var ErrNotFound = errors.New("no such message")

// Source is one mailbox.
type Source interface {
	// Fetch returns up to limit mails with UID > after, ascending, each at
	// most maxBytes (larger ones HeaderOnly).
	Fetch(ctx context.Context, after uint32, limit int, maxBytes int64) (Batch, error)
	// Get fetches one mail by UID (manual mode).
	Get(ctx context.Context, uid uint32, maxBytes int64) (Mail, error)
	// Wait returns after d, or earlier when the server announces new mail
	// (IMAP IDLE) or ctx ends.
	Wait(ctx context.Context, d time.Duration) error
	// Name is the mailbox for keys and logs, e.g. "imap://user@host/INBOX".
	Name() string
	Close() error
}
