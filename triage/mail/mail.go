// Package mail turns one raw RFC 5322 message into what the triage
// pipeline reads: addresses, subject, text and HTML bodies decoded to UTF-8,
// attachments, and the List-Unsubscribe headers byte for byte. It is built
// on github.com/emersion/go-message and never fails on a broken part: what
// could not be read is named in Message.Problems.
package mail

import "time"

// Address is one mailbox of a From/To/Cc header.
type Address struct {
	Name string `json:"name,omitempty"`
	Addr string `json:"addr"` // lower-cased local@domain
	// Display is the addr-spec as the header wrote it (quoted local part,
	// case and escapes kept; one line), for showing the sender to people:
	// Addr is normalised for matching and must not be shown as what the
	// mail said. Set for From (or Sender); "" when it could not be read
	// back reliably, and then Addr is shown.
	Display string `json:"display,omitempty"`
}

// Attachment is one non-body part. Data is nil when the part is larger than
// Limits.MaxAttachmentBytes (Truncated is then true and Size is what was seen).
type Attachment struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type"` // media type only, lower case, e.g. audio/mpeg
	Size        int64  `json:"size"`
	Data        []byte `json:"-"`
	Truncated   bool   `json:"truncated,omitempty"`
}

// Message is a parsed mail.
type Message struct {
	MessageID   string       `json:"message_id,omitempty"`
	From        Address      `json:"from"`
	To          []Address    `json:"to,omitempty"`
	Cc          []Address    `json:"cc,omitempty"`
	DeliveredTo []string     `json:"delivered_to,omitempty"`  // every Delivered-To, lower case
	XOriginalTo []string     `json:"x_original_to,omitempty"` // every X-Original-To, lower case
	Subject     string       `json:"subject"`                 // decoded (RFC 2047), CR/LF removed
	Date        time.Time    `json:"date,omitzero"`
	Text        string       `json:"-"` // text/plain bodies, UTF-8
	HTML        string       `json:"-"` // text/html bodies, UTF-8
	Attachments []Attachment `json:"attachments,omitempty"`
	// ListUnsubscribe and ListUnsubscribePost are the raw header values,
	// unfolded (CRLF+WSP removed) but otherwise byte for byte.
	ListUnsubscribe     string `json:"-"`
	ListUnsubscribePost string `json:"-"`
	// FromCount is how many addresses the From header lists (From is the
	// first); a sender rule must not trust a multi-address From.
	FromCount int `json:"from_count,omitempty"`
	// FromOthers are the From header's addresses after the first, so that
	// a post can show every sender the mail claims, not only the one the
	// rules look at.
	FromOthers []Address `json:"from_others,omitempty"`
	// AuthResults are the Authentication-Results header values (RFC 8601),
	// top (added last, by the receiving server) first, unfolded.
	AuthResults []string `json:"-"`
	// Problems are non-fatal parse findings (unknown charset, broken part,
	// truncated attachment), each one line naming the part.
	Problems []string `json:"problems,omitempty"`
}

// Limits bound what Parse keeps in memory.
type Limits struct {
	MaxAttachmentBytes int64 // default 25 MiB
	MaxTextBytes       int64 // per body kind; default 1 MiB
}
