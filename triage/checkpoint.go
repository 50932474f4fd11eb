package triage

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gpuhost/internal/atomicfile"
	"gpuhost/triage/sink"
)

// Checkpoint is one mailbox's progress, written atomically after every mail
// (issue item 8). LastUID is the highest UID fully posted under
// UIDValidity. Inflight is set before the first post of a mail and cleared
// together with the LastUID advance in one write, so after a crash a set
// marker says exactly which mail may have reached some sinks.
type Checkpoint struct {
	Mailbox     string    `json:"mailbox"`
	UIDValidity uint32    `json:"uidvalidity"`
	LastUID     uint32    `json:"last_uid"`
	Inflight    *Inflight `json:"inflight,omitempty"`
	Updated     time.Time `json:"updated,omitzero"`
	// Costs is the per-day cost of the last CostDays days, oldest first.
	// It rides in the checkpoint (written after every mail anyway) so a
	// restart keeps today's sum; a mail's cost is added in the same write
	// that records its judged result, so it is counted once.
	Costs []DayCost `json:"costs,omitempty"`
	// Alert is the poll-failure alert's state (alert.go), nil while polls
	// succeed and no all-clear is owed.
	Alert *AlertState `json:"alert,omitempty"`
}

// Inflight marks a mail whose first paid call or posting has begun. Posted lists the sinks
// that accepted it, recorded after each one, so that a failure at a later
// sink never re-posts to an earlier one. Judged is the mail's judged
// result (classification, cost, the post), kept until the post succeeds
// so that a sink that stays down for many polls, or a restart, never has
// the mail classified (and billed) again.
type Inflight struct {
	UID    uint32    `json:"uid"`
	Key    string    `json:"key"`
	Since  time.Time `json:"since"`
	Posted []string  `json:"posted,omitempty"`
	Judged *Judged   `json:"judged,omitempty"`
	// Calls are the mail's paid calls until it is judged (calllog.go):
	// the marker is set before the first of them starts, so that a crash
	// at any point leaves what was paid for, and what was lost, on disk.
	Calls []CallRecord `json:"calls,omitempty"`
}

// Judged is a Result as the checkpoint keeps it: the Result (whose Post is
// not in its JSON) and the Post itself.
type Judged struct {
	Result Result    `json:"result"`
	Post   sink.Post `json:"post"`
}

func newJudged(r *Result) *Judged {
	j := &Judged{Result: *r, Post: r.Post}
	j.Result.Post, j.Result.Text = sink.Post{}, ""
	j.Result.Posted, j.Result.AlreadyPosted = nil, nil
	return j
}

// result is a fresh copy of the judged Result with its Post and Text.
func (j *Judged) result() *Result {
	r := j.Result
	r.Problems = append([]string(nil), r.Problems...)
	r.Transcribed = append([]string(nil), r.Transcribed...)
	r.Posted, r.AlreadyPosted = nil, nil
	r.Post = j.Post
	r.Post.Problems = append([]string(nil), j.Post.Problems...)
	r.Text = sink.Text(r.Post)
	return &r
}

func (c Checkpoint) clone() Checkpoint {
	c.Costs = slices.Clone(c.Costs)
	if c.Alert != nil {
		a := c.Alert.clone()
		c.Alert = &a
	}
	if c.Inflight != nil {
		in := *c.Inflight
		in.Posted = append([]string(nil), in.Posted...)
		in.Calls = slices.Clone(in.Calls)
		c.Inflight = &in
	}
	return c
}

// checkpointPath is StateDir/triage/<sanitized mailbox>-<hash>.json: the
// readable part helps an operator find the file, the hash keeps two
// mailboxes whose names sanitize alike apart.
func checkpointPath(stateDir, mailbox string) string {
	var b strings.Builder
	for _, r := range mailbox {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_', r == '@':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 80 {
			break
		}
	}
	sum := sha256.Sum256([]byte(mailbox))
	return filepath.Join(stateDir, "triage", strings.Trim(b.String(), "_.")+"-"+hex.EncodeToString(sum[:4])+".json")
}

// loadCheckpoint reads the file; a missing file is a fresh start (UID 0).
func loadCheckpoint(path string) (Checkpoint, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Checkpoint{}, nil
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("triage: read checkpoint %s: %w", path, err)
	}
	var c Checkpoint
	if err := json.Unmarshal(data, &c); err != nil {
		return Checkpoint{}, fmt.Errorf("triage: checkpoint %s is not valid JSON (fix or remove it; removing reprocesses the mailbox): %w", path, err)
	}
	if c.Inflight != nil && c.Inflight.Key == "" {
		return Checkpoint{}, fmt.Errorf("triage: checkpoint %s: inflight marker without a key", path)
	}
	return c, nil
}

// saveCheckpoint writes c atomically (temp file, fsync, rename, dir fsync).
func saveCheckpoint(path string, c Checkpoint) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("triage: encode checkpoint: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("triage: save checkpoint: %w", err)
	}
	return nil
}
