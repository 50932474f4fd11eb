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
// MaxLivePending/NewCodesPerMinute = 5 minutes whatever others send. Expired
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

type pendingFile struct {
	Version int       `json:"version"`
	Pending []Pending `json:"pending"`
}

// Store reads and writes the two files in Dir. Now is the clock (tests
// inject one); nil means time.Now.
type Store struct {
	Dir string
	Now func() time.Time
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
	data, err := readFile(s.PendingPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return ParsePending(s.PendingPath(), data)
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
	// Evicted is the user whose live code the new one evicted (0: none).
	Evicted int64
}

// Request records that a sender who is not allowlisted wrote to the bot and
// says what to answer: a new code when the sender has had none for CodeTTL,
// a reminder of the live code once, and nothing after that (nor while the
// sender's evicted code would still have been live). A new code is refused
// with ErrRateLimited past NewCodesPerMinute; past MaxLivePending it evicts
// the oldest live code.
func (s *Store) Request(who Sender) (Outcome, error) {
	if who.UserID <= 0 || who.ChatID == 0 {
		return Outcome{}, fmt.Errorf("pairing request: invalid sender (user %d, chat %d)", who.UserID, who.ChatID)
	}
	var out Outcome
	err := s.locked(func() error {
		ps, err := s.ReadPending()
		if err != nil {
			return err
		}
		now := s.now()
		if i := slices.IndexFunc(ps, func(p Pending) bool { return p.UserID == who.UserID }); i >= 0 && !ps[i].Expired(now) {
			p := &ps[i]
			switch {
			case p.Evicted || p.Reminded:
				out = Outcome{Action: ActionNone, Code: p.Code, ExpiresAt: p.ExpiresAt()}
				return nil
			default:
				p.Reminded = true
				out = Outcome{Action: ActionRemind, Code: p.Code, ExpiresAt: p.ExpiresAt()}
				return s.writePending(ps)
			}
		}
		recent := 0
		var live []int
		for i, p := range ps {
			if now.Sub(p.CreatedAt) < time.Minute {
				recent++
			}
			if p.Live(now) {
				live = append(live, i)
			}
		}
		if recent >= NewCodesPerMinute {
			return fmt.Errorf("%w: %d new codes in the last minute (at most %d); not issuing one to user %d", ErrRateLimited, recent, NewCodesPerMinute, who.UserID)
		}
		if len(live) >= MaxLivePending {
			oldest := live[0]
			for _, i := range live[1:] {
				if ps[i].CreatedAt.Before(ps[oldest].CreatedAt) {
					oldest = i
				}
			}
			ps[oldest].Evicted = true
			out.Evicted = ps[oldest].UserID
		}
		code, err := newCode(ps)
		if err != nil {
			return err
		}
		// One entry per sender: an expired code of this sender is replaced.
		ps = slices.DeleteFunc(ps, func(p Pending) bool { return p.UserID == who.UserID })
		p := Pending{Code: code, UserID: who.UserID, ChatID: who.ChatID,
			Username: CleanName(who.Username), FirstName: CleanName(who.FirstName), CreatedAt: now.UTC()}
		ps = append(ps, p)
		out.Action, out.Code, out.ExpiresAt = ActionNewCode, code, p.ExpiresAt()
		return s.writePending(ps)
	})
	if err != nil {
		return Outcome{}, err
	}
	return out, nil
}

// Purge removes expired and evicted codes from pending.json, or with all
// every pending code. With all, an unreadable pending.json is replaced by an
// empty one (corrupt is the one case where the file cannot be repaired
// otherwise). The allowlist is never touched. It returns how many codes
// were removed (-1: the unreadable file was replaced).
func (s *Store) Purge(all bool) (int, error) {
	removed := 0
	err := s.locked(func() error {
		ps, err := s.ReadPending()
		if err != nil {
			if !all {
				return fmt.Errorf("%w (`gpuhost pair purge --all` replaces it with an empty one)", err)
			}
			removed = -1
			return s.writePending(nil)
		}
		now := s.now()
		n := len(ps)
		if all {
			ps = nil
		} else {
			ps = slices.DeleteFunc(ps, func(p Pending) bool { return !p.Live(now) })
		}
		removed = n - len(ps)
		return s.writePending(ps)
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
		ps, err := s.ReadPending()
		if err != nil {
			return err
		}
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
		return s.writePending(slices.Delete(ps, i, i+1))
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
	var f pendingFile
	if err := decodeStrict(name, data, &f); err != nil {
		return nil, err
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("%s: %w %d (want %d)", name, errUnsupportedVers, f.Version, fileVersion)
	}
	codes := map[string]bool{}
	users := map[int64]bool{}
	for i, p := range f.Pending {
		if c, err := NormalizeCode(p.Code); err != nil || c != p.Code {
			return nil, fmt.Errorf("%s: pending[%d]: %w: bad code", name, i, errCorruptFile)
		}
		if p.UserID <= 0 || p.ChatID == 0 || p.CreatedAt.IsZero() {
			return nil, fmt.Errorf("%s: pending[%d]: %w: user_id, chat_id and created_at must be set", name, i, errCorruptFile)
		}
		if codes[p.Code] || users[p.UserID] {
			return nil, fmt.Errorf("%s: pending[%d]: %w: code or user_id %d listed twice", name, i, errCorruptFile, p.UserID)
		}
		codes[p.Code], users[p.UserID] = true, true
		if !cleanStored(p.Username) || !cleanStored(p.FirstName) {
			return nil, fmt.Errorf("%s: pending[%d]: %w: username/first_name with control characters or too long", name, i, errCorruptFile)
		}
	}
	return f.Pending, nil
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

// writePending prunes and writes pending.json. Should the file still be
// over MaxFileBytes (it cannot be with the limits above; this is the
// backstop), the oldest expired codes are dropped until it fits, and an
// error is returned if even the live codes alone do not.
func (s *Store) writePending(ps []Pending) error {
	now := s.now()
	ps = prune(ps, now)
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
