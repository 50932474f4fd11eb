// Package pairing keeps who may talk to gpuhost's Telegram bot: an allowlist
// of Telegram user IDs and the one-time pairing codes of senders waiting for
// the operator's approval, both as JSON files in the state directory.
//
// Two processes share these files: the daemon's bot (which only ever reads
// the allowlist and records pending codes) and `gpuhost pair` on the shell
// (the only writer of the allowlist). Rights live on the machine, never in a
// chat: nothing a chat message says reaches Approve or Revoke. Every write is
// atomic (temp file, fsync, rename) under an exclusive flock, and a file that
// cannot be parsed is an error naming it — for the allowlist that means
// nobody is allowed (fail closed) and nothing is overwritten.
//
// Fair pairing under a flood of strangers: each sender gets at most one code
// per CodeTTL (and one reminder); at most NewCodesPerMinute new codes are
// issued in any minute; at most MaxLivePending codes are live, and when a
// new sender would exceed that, the oldest live code is evicted (its sender
// gets no new one until that code's TTL has passed). So a flood never locks
// out newcomers for good, and every code stays approvable for at least
// MaxLivePending/NewCodesPerMinute = 5 minutes whatever others send.
// A sender refused by the rate limit waits in a bounded line (in the
// bot's memory: a restart empties it, and those still there write again);
// a code that the rate frees goes to the waiting sender who tried in the
// most distinct TryEvery windows (ties: the one waiting longest), not to
// whoever writes in that second, and the bot sends it to them unasked
// (Outcome.Grants). While several wait, codes are spaced evenly over the
// minute. A person who keeps trying thus outranks a flood of one-shot
// senders from their second try on and gets the next code freed. An operator can always pair a known
// user id without any code (Add, `gpuhost pair add`). Expired
// and evicted codes are kept (for a clear "expired" on approve) at most
// KeepExpired and at most MaxKeptExpired of them, which bounds pending.json
// well under MaxFileBytes; readers never refuse a file for its size.
package pairing

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"gpuhost/internal/atomicfile"
)

// Limits and shapes of codes and files.
const (
	// CodeTTL is how long a pairing code can be approved, and also the
	// per-sender rate limit: a sender gets at most one new code per CodeTTL.
	CodeTTL = 10 * time.Minute
	// CodeLen is the number of characters of a code: 31^8 ≈ 8.5e11 codes.
	CodeLen = 8
	// CodeAlphabet leaves out characters that read alike (0/O, 1/I/L), since
	// the operator types the code from a phone screen.
	CodeAlphabet = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
	// MaxLivePending caps unexpired codes; a new code beyond it evicts the
	// oldest live one.
	MaxLivePending = 100
	// NewCodesPerMinute is the global rate limit of new codes: beyond it a
	// new sender gets no answer (and no code) until the minute has passed.
	// With MaxLivePending it guarantees every code ≥ 5 minutes of life.
	NewCodesPerMinute = 20
	// KeepExpired is how long an expired or evicted code stays on file, so
	// that approving it says "expired" rather than "unknown".
	KeepExpired = 24 * time.Hour
	// MaxKeptExpired bounds the expired and evicted codes on file (the
	// newest are kept).
	MaxKeptExpired = 200
	// MaxFileBytes is the most pending.json may grow to when written; the
	// limits above keep it far below. Readers accept any size, so a file
	// from an older version that grew past it is read (and pruned on the
	// next write), never refused.
	MaxFileBytes = 1 << 20
	// fileVersion is the format of both files.
	fileVersion = 1
	// codeSpacing is the least time between two codes while several
	// senders wait: NewCodesPerMinute spread over the minute.
	codeSpacing = time.Minute / NewCodesPerMinute
	// MaxWaiting bounds the senders waiting for a code; beyond it the one
	// with the fewest tries (then the longest quiet) is dropped. At a flood
	// of 25 new senders a second, a person who writes again within 20 s
	// keeps their place.
	MaxWaiting = 500
	// TryEvery is the window in which a waiting sender's messages count as
	// one try: writing faster does not jump the queue.
	TryEvery = 10 * time.Second
	// maxNameRunes bounds stored usernames and first names (at most 64 × 4
	// bytes, 64 × 6 JSON-escaped: an entry stays under 1 KiB).
	maxNameRunes = 64
)

// File names inside Dir.
const (
	AllowlistFile = "allowlist.json"
	PendingFile   = "pending.json"
	lockFile      = ".lock"
)

// Errors of Approve and Revoke, for callers that explain them.
var (
	ErrUnknownCode     = errors.New("unknown pairing code")
	ErrCodeExpired     = errors.New("pairing code expired")
	ErrNotAllowlisted  = errors.New("not on the allowlist")
	ErrRateLimited     = errors.New("pairing codes rate-limited")
	ErrCodeEvicted     = errors.New("pairing code evicted")
	ErrMalformedCode   = errors.New("malformed pairing code")
	errCorruptFile     = errors.New("corrupt file")
	errFileTooLarge    = errors.New("file too large")
	errUnsupportedVers = errors.New("unsupported version")
)

// Sender is who wrote to the bot, as Telegram reports it.
type Sender struct {
	UserID    int64
	ChatID    int64
	Username  string
	FirstName string
}

// Entry is one allowlisted Telegram user. ChatID is their private chat with
// the bot (equal to the user ID for private chats), where notifications go.
type Entry struct {
	UserID     int64     `json:"user_id"`
	ChatID     int64     `json:"chat_id"`
	Username   string    `json:"username,omitempty"`
	FirstName  string    `json:"first_name,omitempty"`
	ApprovedAt time.Time `json:"approved_at"`
}

// Allowlist is the content of allowlist.json.
type Allowlist struct {
	Version int     `json:"version"`
	Users   []Entry `json:"users"`
}

// Find returns the entry of a user ID.
func (a Allowlist) Find(userID int64) (Entry, bool) {
	for _, e := range a.Users {
		if e.UserID == userID {
			return e, true
		}
	}
	return Entry{}, false
}

// Pending is one issued, not yet approved pairing code.
type Pending struct {
	Code      string    `json:"code"`
	UserID    int64     `json:"user_id"`
	ChatID    int64     `json:"chat_id"`
	Username  string    `json:"username,omitempty"`
	FirstName string    `json:"first_name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Reminded is set once the sender was reminded of the code, so that a
	// chatty stranger gets at most two messages per code.
	Reminded bool `json:"reminded,omitempty"`
	// Evicted is set when newer codes pushed this one out of the
	// MaxLivePending live codes: it can no longer be approved.
	Evicted bool `json:"evicted,omitempty"`
}

// ExpiresAt is when the code can no longer be approved.
func (p Pending) ExpiresAt() time.Time { return p.CreatedAt.Add(CodeTTL) }

// Expired reports whether the code is past its TTL at now.
func (p Pending) Expired(now time.Time) bool { return !now.Before(p.ExpiresAt()) }

// Live reports whether the code can be approved at now.
func (p Pending) Live(now time.Time) bool { return !p.Evicted && !p.Expired(now) }

// Waiter is a sender the rate limit refused a code, waiting for one. A
// waiter quiet for CodeTTL has given up and is dropped.
type Waiter struct {
	UserID    int64     `json:"user_id"`
	ChatID    int64     `json:"chat_id"`
	Username  string    `json:"username,omitempty"`
	FirstName string    `json:"first_name,omitempty"`
	FirstTry  time.Time `json:"first_try"`
	LastTry   time.Time `json:"last_try"`
	// Tries counts the TryEvery windows in which the sender wrote.
	Tries int `json:"tries"`
}

// Grant is a code handed to a waiting sender by someone else's request:
// the bot sends it to ChatID.
type Grant struct {
	UserID    int64
	ChatID    int64
	Code      string
	ExpiresAt time.Time
}

type pendingFile struct {
	Version int       `json:"version"`
	Pending []Pending `json:"pending"`
}

// Store reads and writes the two files in Dir. Now is the clock (tests
// inject one); nil means time.Now.
type Store struct {
	Dir string
	Now func() time.Time

	lineMu sync.Mutex
	line   []Waiter // senders waiting for a code (Request); this process only
}

// New returns the store of a gpuhost state directory (<stateDir>/telegram).
func New(stateDir string) *Store {
	return &Store{Dir: filepath.Join(stateDir, "telegram")}
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// AllowlistPath is the allowlist file, for messages.
func (s *Store) AllowlistPath() string { return filepath.Join(s.Dir, AllowlistFile) }

// PendingPath is the pending-codes file, for messages.
func (s *Store) PendingPath() string { return filepath.Join(s.Dir, PendingFile) }

// ReadAllowlist reads allowlist.json; a missing file is an empty allowlist,
// anything unreadable or malformed is an error naming the file.
func (s *Store) ReadAllowlist() (Allowlist, error) {
	data, err := readFile(s.AllowlistPath())
	if errors.Is(err, os.ErrNotExist) {
		return Allowlist{Version: fileVersion, Users: []Entry{}}, nil
	}
	if err != nil {
		return Allowlist{}, err
	}
	return ParseAllowlist(s.AllowlistPath(), data)
}

// Allowed reports whether a user may use the bot. Any error reading the
// allowlist is returned with allowed false: a corrupt allowlist lets nobody in.
func (s *Store) Allowed(userID int64) (bool, error) {
	a, err := s.ReadAllowlist()
	if err != nil {
		return false, err
	}
	_, ok := a.Find(userID)
	return ok, nil
}

// ReadPending reads pending.json (missing file: none pending).
func (s *Store) ReadPending() ([]Pending, error) {
	f, err := s.readPendingFile()
	return f.Pending, err
}

// Waiting returns the senders waiting in this process for a code, first
// in line first.
func (s *Store) Waiting() []Waiter {
	s.lineMu.Lock()
	ws := slices.Clone(s.line)
	s.lineMu.Unlock()
	slices.SortStableFunc(ws, waiterOrder)
	return ws
}

func (s *Store) readPendingFile() (pendingFile, error) {
	data, err := readFile(s.PendingPath())
	if errors.Is(err, os.ErrNotExist) {
		return pendingFile{Version: fileVersion}, nil
	}
	if err != nil {
		return pendingFile{}, err
	}
	return parsePendingFile(s.PendingPath(), data)
}

// List returns all pending codes on file, expired ones included, oldest first.
func (s *Store) List() ([]Pending, error) {
	ps, err := s.ReadPending()
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(ps, func(a, b Pending) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return ps, nil
}

// Action is what the bot should tell a sender who is not allowlisted.
type Action int

// Actions of Request.
const (
	// ActionNone: say nothing (the sender already has a code and was reminded).
	ActionNone Action = iota
	// ActionNewCode: send the new code.
	ActionNewCode
	// ActionRemind: send the same code once more.
	ActionRemind
)

// Outcome is Request's answer.
type Outcome struct {
	Action    Action
	Code      string
	ExpiresAt time.Time
	// Evicted are the users whose live codes the new ones evicted.
	Evicted []int64
	// Grants are codes freed by the rate and handed to waiting senders
	// other than this one: the bot sends each to its chat.
	Grants []Grant
}

// Request records that a sender who is not allowlisted wrote to the bot and
// says what to answer: a new code when the sender has had none for CodeTTL,
// a reminder of the live code once, and nothing after that (nor while the
// sender's evicted code would still have been live). A new code goes to
// the first waiting sender in line (waiterOrder), this one included, while
// the rate (NewCodesPerMinute) allows; codes for others are in
// Outcome.Grants. When this sender got none, the error is ErrRateLimited
// and the Outcome still carries the Grants to send. Past MaxLivePending a
// new code evicts the oldest live one.
func (s *Store) Request(who Sender) (Outcome, error) {
	if who.UserID <= 0 || who.ChatID == 0 {
		return Outcome{}, fmt.Errorf("pairing request: invalid sender (user %d, chat %d)", who.UserID, who.ChatID)
	}
	var (
		out     Outcome
		refused error
	)
	s.lineMu.Lock()
	defer s.lineMu.Unlock()
	err := s.locked(func() error {
		f, err := s.readPendingFile()
		if err != nil {
			return err
		}
		now := s.now()
		changed := false
		if i := slices.IndexFunc(f.Pending, func(p Pending) bool { return p.UserID == who.UserID }); i >= 0 && !f.Pending[i].Expired(now) {
			p := &f.Pending[i]
			out = Outcome{Action: ActionNone, Code: p.Code, ExpiresAt: p.ExpiresAt()}
			if !p.Evicted && !p.Reminded {
				p.Reminded, changed = true, true
				out.Action = ActionRemind
			}
		} else {
			s.line = addWaiter(s.line, who, now)
		}
		// Every request hands out the codes the rate has freed since the
		// last, whoever sends it.
		issued, err := s.handOut(&f, now, who.UserID, &out)
		if err != nil {
			return err
		}
		if out.Action == ActionNone && slices.ContainsFunc(s.line, func(w Waiter) bool { return w.UserID == who.UserID }) {
			refused = fmt.Errorf("%w: at most %d new codes a minute, spread over it while several wait; user %d waits in line for one",
				ErrRateLimited, NewCodesPerMinute, who.UserID)
		}
		if !changed && !issued {
			return nil // nothing on file changes
		}
		return s.writePendingFile(f)
	})
	if err != nil {
		return Outcome{}, err
	}
	return out, refused
}

// HandOutEvery is how often the bot offers the line the codes the rate has
// freed (HandOut), so that the line moves when nobody writes: the spacing
// of codes while several wait.
const HandOutEvery = codeSpacing

// HandOut issues the codes the rate has freed since the last to the first
// in line, with no sender writing: the bot calls it on its own clock
// (HandOutEvery) and sends each Grant unasked. Without it the line would
// move only when a stranger writes, and after a flood a newcomer's single
// try would wait for the next stranger.
func (s *Store) HandOut() ([]Grant, error) {
	s.lineMu.Lock()
	defer s.lineMu.Unlock()
	if len(s.line) == 0 {
		return nil, nil
	}
	var out Outcome
	err := s.locked(func() error {
		f, err := s.readPendingFile()
		if err != nil {
			return err
		}
		issued, err := s.handOut(&f, s.now(), 0, &out)
		if err != nil || !issued {
			return err
		}
		return s.writePendingFile(f)
	})
	if err != nil {
		return nil, fmt.Errorf("hand out pairing codes to the senders in line: %w", err)
	}
	return out.Grants, nil
}

// handOut issues the codes the rate allows now to the first in line: up to
// NewCodesPerMinute in a minute, and while several wait one at a time, at
// least codeSpacing apart, so that each goes to whoever is first in line
// then rather than all at once to the longest waiting. A code for who is
// out's ActionNewCode, the others out.Grants.
func (s *Store) handOut(f *pendingFile, now time.Time, who int64, out *Outcome) (issued bool, err error) {
	if len(s.line) == 0 {
		return false, nil
	}
	recent := 0
	var last time.Time
	for _, p := range f.Pending {
		if now.Sub(p.CreatedAt) < time.Minute {
			recent++
		}
		if p.CreatedAt.After(last) {
			last = p.CreatedAt
		}
	}
	free := NewCodesPerMinute - recent
	if len(s.line) > 1 {
		free = 0
		if recent < NewCodesPerMinute && now.Sub(last) >= codeSpacing {
			free = 1
		}
	}
	if free <= 0 {
		return false, nil
	}
	a, err := s.ReadAllowlist()
	if err != nil {
		return false, err
	}
	for free > 0 && len(s.line) > 0 {
		w := slices.MinFunc(s.line, waiterOrder)
		s.line = slices.DeleteFunc(s.line, func(x Waiter) bool { return x.UserID == w.UserID })
		if _, ok := a.Find(w.UserID); ok {
			continue // paired meanwhile (gpuhost pair add): no code
		}
		free--
		var p Pending
		if f.Pending, p, err = issue(f.Pending, w, now, out); err != nil {
			return issued, err
		}
		issued = true
		if w.UserID == who {
			out.Action, out.Code, out.ExpiresAt = ActionNewCode, p.Code, p.ExpiresAt()
		} else {
			out.Grants = append(out.Grants, Grant{UserID: w.UserID, ChatID: w.ChatID, Code: p.Code, ExpiresAt: p.ExpiresAt()})
		}
	}
	return issued, nil
}

// issue adds a new code for w to ps, evicting the oldest live code when
// MaxLivePending are live (noted in out.Evicted).
func issue(ps []Pending, w Waiter, now time.Time, out *Outcome) ([]Pending, Pending, error) {
	var live []int
	for i, p := range ps {
		if p.Live(now) {
			live = append(live, i)
		}
	}
	if len(live) >= MaxLivePending {
		oldest := live[0]
		for _, i := range live[1:] {
			if ps[i].CreatedAt.Before(ps[oldest].CreatedAt) {
				oldest = i
			}
		}
		ps[oldest].Evicted = true
		out.Evicted = append(out.Evicted, ps[oldest].UserID)
	}
	code, err := newCode(ps)
	if err != nil {
		return ps, Pending{}, err
	}
	// One entry per sender: an expired code of this sender is replaced.
	ps = slices.DeleteFunc(ps, func(p Pending) bool { return p.UserID == w.UserID })
	p := Pending{Code: code, UserID: w.UserID, ChatID: w.ChatID,
		Username: w.Username, FirstName: w.FirstName, CreatedAt: now.UTC()}
	return append(ps, p), p, nil
}

// waiterOrder is the line for codes: most tries first, then the longest
// waiting, then the lower id (a total order, so the line is reproducible).
func waiterOrder(a, b Waiter) int {
	if a.Tries != b.Tries {
		return b.Tries - a.Tries
	}
	if c := a.FirstTry.Compare(b.FirstTry); c != 0 {
		return c
	}
	switch {
	case a.UserID < b.UserID:
		return -1
	case a.UserID > b.UserID:
		return 1
	}
	return 0
}

// addWaiter notes a try of who: a new waiter, or one more try when the
// last one is TryEvery ago. Waiters quiet for CodeTTL are dropped, and the
// line is cut to MaxWaiting, dropping the waiter with the fewest tries
// that has been quiet longest (never who: a newcomer is not pushed out by
// the next stranger).
func addWaiter(ws []Waiter, who Sender, now time.Time) []Waiter {
	ws = slices.DeleteFunc(ws, func(w Waiter) bool { return now.Sub(w.LastTry) >= CodeTTL })
	if i := slices.IndexFunc(ws, func(w Waiter) bool { return w.UserID == who.UserID }); i >= 0 {
		if now.Sub(ws[i].LastTry) >= TryEvery {
			ws[i].Tries++
			ws[i].LastTry = now.UTC()
		}
		ws[i].ChatID = who.ChatID
	} else {
		ws = append(ws, Waiter{UserID: who.UserID, ChatID: who.ChatID, Username: CleanName(who.Username), FirstName: CleanName(who.FirstName),
			FirstTry: now.UTC(), LastTry: now.UTC(), Tries: 1})
	}
	for len(ws) > MaxWaiting {
		drop := -1
		for i, w := range ws {
			if w.UserID == who.UserID {
				continue
			}
			if drop < 0 || w.Tries < ws[drop].Tries || (w.Tries == ws[drop].Tries && w.LastTry.Before(ws[drop].LastTry)) {
				drop = i
			}
		}
		ws = slices.Delete(ws, drop, drop+1)
	}
	return ws
}

// Add puts a user on the allowlist without a code: the operator's way to
// pair someone whose Telegram user id they know, which no flood of
// strangers can block. chatID 0 means the user's private chat (its id is
// the user id). A pending code of the user is dropped. The running bot
// reads the allowlist on every message, so the user is answered from their
// next message on, and a place in its line is given up when the user's
// turn comes.
func (s *Store) Add(userID, chatID int64, username, firstName string) (Entry, error) {
	if userID <= 0 {
		return Entry{}, fmt.Errorf("pair add: %d is not a Telegram user id (a positive number)", userID)
	}
	if chatID == 0 {
		chatID = userID
	}
	var entry Entry
	err := s.locked(func() error {
		a, err := s.ReadAllowlist()
		if err != nil {
			return fmt.Errorf("%w (not changing it; fix or remove the file, then add again)", err)
		}
		entry = Entry{UserID: userID, ChatID: chatID, Username: CleanName(username), FirstName: CleanName(firstName), ApprovedAt: s.now().UTC()}
		a.Users = slices.DeleteFunc(a.Users, func(e Entry) bool { return e.UserID == userID })
		a.Users = append(a.Users, entry)
		a.Version = fileVersion
		if err := s.writeJSON(s.AllowlistPath(), a); err != nil {
			return err
		}
		f, err := s.readPendingFile()
		if err != nil {
			return nil // the allowlist is what counts; a corrupt pending.json is reported where it is read
		}
		f.Pending = slices.DeleteFunc(f.Pending, func(p Pending) bool { return p.UserID == userID })
		return s.writePendingFile(f)
	})
	return entry, err
}

// Purge removes expired and evicted codes from pending.json, or with all
// every pending code. With all, an unreadable pending.json is replaced by an
// empty one (corrupt is the one case where the file cannot be repaired
// otherwise). The allowlist is never touched. It returns how many codes
// were removed (-1: the unreadable file was replaced).
func (s *Store) Purge(all bool) (int, error) {
	removed := 0
	err := s.locked(func() error {
		f, err := s.readPendingFile()
		if err != nil {
			if !all {
				return fmt.Errorf("%w (`gpuhost pair purge --all` replaces it with an empty one)", err)
			}
			removed = -1
			return s.writePendingFile(pendingFile{})
		}
		now := s.now()
		n := len(f.Pending)
		if all {
			f.Pending = nil
		} else {
			f.Pending = slices.DeleteFunc(f.Pending, func(p Pending) bool { return !p.Live(now) })
		}
		removed = n - len(f.Pending)
		return s.writePendingFile(f)
	})
	return removed, err
}

// Approve moves the sender of a live code to the allowlist. An expired
// code is refused with ErrCodeExpired and a message that says what to do.
func (s *Store) Approve(code string) (Entry, error) {
	norm, err := NormalizeCode(code)
	if err != nil {
		return Entry{}, err
	}
	var entry Entry
	err = s.locked(func() error {
		f, err := s.readPendingFile()
		if err != nil {
			return err
		}
		ps := f.Pending
		i := slices.IndexFunc(ps, func(p Pending) bool { return p.Code == norm })
		if i < 0 {
			return fmt.Errorf("%w %s: no such code in %s (see `gpuhost pair list`; codes are kept %s after expiry)", ErrUnknownCode, norm, s.PendingPath(), KeepExpired)
		}
		p := ps[i]
		now := s.now()
		if p.Evicted {
			return fmt.Errorf("%w: code %s of user %d was replaced by newer codes during a flood of pairing requests (at most %d live); ask them to message the bot again after %s",
				ErrCodeEvicted, norm, p.UserID, MaxLivePending, p.ExpiresAt().Local().Format(time.TimeOnly))
		}
		if p.Expired(now) {
			return fmt.Errorf("%w: code %s of user %d expired %s ago (codes are valid for %s); ask them to message the bot again for a new code",
				ErrCodeExpired, norm, p.UserID, now.Sub(p.ExpiresAt()).Round(time.Second), CodeTTL)
		}
		a, err := s.ReadAllowlist()
		if err != nil {
			return fmt.Errorf("%w (not changing it; fix or remove the file, then approve again)", err)
		}
		entry = Entry{UserID: p.UserID, ChatID: p.ChatID, Username: p.Username, FirstName: p.FirstName, ApprovedAt: now.UTC()}
		a.Users = slices.DeleteFunc(a.Users, func(e Entry) bool { return e.UserID == p.UserID })
		a.Users = append(a.Users, entry)
		a.Version = fileVersion
		if err := s.writeJSON(s.AllowlistPath(), a); err != nil {
			return err
		}
		// Allowlist first: a crash here leaves only a stale pending entry.
		f.Pending = slices.Delete(ps, i, i+1)
		return s.writePendingFile(f)
	})
	return entry, err
}

// Revoke removes a user from the allowlist; the bot stops answering them
// with their next message (it re-reads the file on every message).
func (s *Store) Revoke(userID int64) (Entry, error) {
	var entry Entry
	err := s.locked(func() error {
		a, err := s.ReadAllowlist()
		if err != nil {
			return fmt.Errorf("%w (not changing it; fix or remove the file)", err)
		}
		e, ok := a.Find(userID)
		if !ok {
			return fmt.Errorf("user %d: %w (%s)", userID, ErrNotAllowlisted, s.AllowlistPath())
		}
		entry = e
		a.Users = slices.DeleteFunc(a.Users, func(e Entry) bool { return e.UserID == userID })
		a.Version = fileVersion
		return s.writeJSON(s.AllowlistPath(), a)
	})
	return entry, err
}

// NormalizeCode accepts what an operator types (lower case, spaces or
// dashes in between) and returns the code as stored.
func NormalizeCode(code string) (string, error) {
	c := strings.ToUpper(strings.NewReplacer(" ", "", "-", "", "\t", "").Replace(strings.TrimSpace(code)))
	if utf8.RuneCountInString(c) != CodeLen {
		return "", fmt.Errorf("%w: want %d characters from %s, got %d", ErrMalformedCode, CodeLen, CodeAlphabet, utf8.RuneCountInString(c))
	}
	for _, r := range c {
		if !strings.ContainsRune(CodeAlphabet, r) {
			return "", fmt.Errorf("%w: %q is not one of %s", ErrMalformedCode, r, CodeAlphabet)
		}
	}
	return c, nil
}

// CleanName makes a Telegram-supplied name safe to store and print on the
// operator's terminal: valid UTF-8, no control or bidirectional-override
// characters (which could fake what `gpuhost pair list` shows), bounded.
func CleanName(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	n := 0
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || unicode.Is(unicode.Cf, r) {
			continue
		}
		if n == maxNameRunes {
			b.WriteRune('…')
			break
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

// ParseAllowlist decodes and validates allowlist.json; name is the file for
// messages. Anything unexpected is an error: the allowlist fails closed.
func ParseAllowlist(name string, data []byte) (Allowlist, error) {
	var a Allowlist
	if err := decodeStrict(name, data, &a); err != nil {
		return Allowlist{}, err
	}
	if a.Version != fileVersion {
		return Allowlist{}, fmt.Errorf("%s: %w %d (want %d)", name, errUnsupportedVers, a.Version, fileVersion)
	}
	seen := map[int64]bool{}
	for i, e := range a.Users {
		if e.UserID <= 0 || e.ChatID == 0 {
			return Allowlist{}, fmt.Errorf("%s: users[%d]: %w: user_id %d / chat_id %d must be set (user_id positive)", name, i, errCorruptFile, e.UserID, e.ChatID)
		}
		if seen[e.UserID] {
			return Allowlist{}, fmt.Errorf("%s: users[%d]: %w: user_id %d listed twice", name, i, errCorruptFile, e.UserID)
		}
		seen[e.UserID] = true
		if !cleanStored(e.Username) || !cleanStored(e.FirstName) {
			return Allowlist{}, fmt.Errorf("%s: users[%d]: %w: username/first_name with control characters or too long", name, i, errCorruptFile)
		}
	}
	if a.Users == nil {
		a.Users = []Entry{}
	}
	return a, nil
}

// ParsePending decodes and validates pending.json; name is the file.
func ParsePending(name string, data []byte) ([]Pending, error) {
	f, err := parsePendingFile(name, data)
	return f.Pending, err
}

func parsePendingFile(name string, data []byte) (pendingFile, error) {
	var f pendingFile
	if err := decodeStrict(name, data, &f); err != nil {
		return pendingFile{}, err
	}
	if f.Version != fileVersion {
		return pendingFile{}, fmt.Errorf("%s: %w %d (want %d)", name, errUnsupportedVers, f.Version, fileVersion)
	}
	if err := checkPending(name, f.Pending); err != nil {
		return pendingFile{}, err
	}
	return f, nil
}

func checkPending(name string, pending []Pending) error {
	codes := map[string]bool{}
	users := map[int64]bool{}
	for i, p := range pending {
		if c, err := NormalizeCode(p.Code); err != nil || c != p.Code {
			return fmt.Errorf("%s: pending[%d]: %w: bad code", name, i, errCorruptFile)
		}
		if p.UserID <= 0 || p.ChatID == 0 || p.CreatedAt.IsZero() {
			return fmt.Errorf("%s: pending[%d]: %w: user_id, chat_id and created_at must be set", name, i, errCorruptFile)
		}
		if codes[p.Code] || users[p.UserID] {
			return fmt.Errorf("%s: pending[%d]: %w: code or user_id %d listed twice", name, i, errCorruptFile, p.UserID)
		}
		codes[p.Code], users[p.UserID] = true, true
		if !cleanStored(p.Username) || !cleanStored(p.FirstName) {
			return fmt.Errorf("%s: pending[%d]: %w: username/first_name with control characters or too long", name, i, errCorruptFile)
		}
	}
	return nil
}

func cleanStored(s string) bool { return CleanName(s) == s }

// decodeStrict decodes one JSON object with no unknown fields and nothing
// after it.
func decodeStrict(name string, data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return fmt.Errorf("%s: %w: empty (want a JSON object; remove the file to start over)", name, errCorruptFile)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w: %v", name, errCorruptFile, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%s: %w: data after the JSON object", name, errCorruptFile)
	}
	return nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	// No size limit: both files are written only by gpuhost under a 0700
	// directory and bounded when written; refusing a large one would lock
	// the operator out until it was deleted by hand.
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

// prune drops expired and evicted codes older than KeepExpired after their
// expiry, and all but the newest MaxKeptExpired of them.
func prune(ps []Pending, now time.Time) []Pending {
	ps = slices.DeleteFunc(ps, func(p Pending) bool { return now.Sub(p.ExpiresAt()) > KeepExpired })
	var dead []time.Time
	for _, p := range ps {
		if !p.Live(now) {
			dead = append(dead, p.CreatedAt)
		}
	}
	if len(dead) <= MaxKeptExpired {
		return ps
	}
	slices.SortFunc(dead, func(a, b time.Time) int { return b.Compare(a) })
	cut := dead[MaxKeptExpired-1] // keep dead codes created at or after cut
	kept := 0
	return slices.DeleteFunc(ps, func(p Pending) bool {
		if p.Live(now) {
			return false
		}
		if p.CreatedAt.Before(cut) || kept >= MaxKeptExpired {
			return true
		}
		kept++
		return false
	})
}

func newCode(existing []Pending) (string, error) {
	max := big.NewInt(int64(len(CodeAlphabet)))
	for range 16 {
		var b strings.Builder
		for range CodeLen {
			n, err := rand.Int(rand.Reader, max)
			if err != nil {
				return "", fmt.Errorf("generate pairing code: %w", err)
			}
			b.WriteByte(CodeAlphabet[n.Int64()])
		}
		c := b.String()
		if !slices.ContainsFunc(existing, func(p Pending) bool { return p.Code == c }) {
			return c, nil
		}
	}
	return "", errors.New("generate pairing code: no unused code after 16 tries")
}

// writePendingFile prunes and writes pending.json. Should the file still be
// over MaxFileBytes (it cannot be with the limits above; this is the
// backstop), the oldest expired codes are dropped until it fits, and an
// error is returned if even the live codes alone do not.
func (s *Store) writePendingFile(f pendingFile) error {
	now := s.now()
	ps := prune(f.Pending, now)
	if ps == nil {
		ps = []Pending{}
	}
	for {
		data, err := json.MarshalIndent(pendingFile{Version: fileVersion, Pending: ps}, "", "  ")
		if err != nil {
			return fmt.Errorf("encode %s: %w", s.PendingPath(), err)
		}
		if len(data) < MaxFileBytes {
			return atomicfile.Write(s.PendingPath(), append(data, '\n'), 0o600)
		}
		oldest := -1
		for i, p := range ps {
			if !p.Live(now) && (oldest < 0 || p.CreatedAt.Before(ps[oldest].CreatedAt)) {
				oldest = i
			}
		}
		if oldest < 0 {
			return fmt.Errorf("write %s: %w (%d bytes of live codes, limit %d)", s.PendingPath(), errFileTooLarge, len(data), MaxFileBytes)
		}
		ps = slices.Delete(ps, oldest, oldest+1)
	}
}

func (s *Store) writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return atomicfile.Write(path, append(data, '\n'), 0o600)
}

// locked runs fn holding an exclusive flock on Dir/.lock, so that the bot
// (issuing codes) and `gpuhost pair` (approving) never lose each other's
// read-modify-write.
func (s *Store) locked(fn func() error) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("create pairing directory %s: %w", s.Dir, err)
	}
	path := filepath.Join(s.Dir, lockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open lock %s: %w", path, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:errcheck // close releases it anyway
	return fn()
}
