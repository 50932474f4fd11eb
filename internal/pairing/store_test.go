package pairing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/internal/testkit"
)

func newStore(t *testing.T) (*Store, *testkit.Clock) {
	t.Helper()
	c := testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s := New(t.TempDir())
	s.Now = c.Now
	return s, c
}

func alice() Sender { return Sender{UserID: 1001, ChatID: 1001, Username: "alice", FirstName: "Alice"} }

func TestRequestIssuesOneCodeThenRemindsOnceThenNothing(t *testing.T) {
	s, c := newStore(t)
	first, err := s.Request(alice())
	if err != nil {
		t.Fatal(err)
	}
	if first.Action != ActionNewCode || len(first.Code) != CodeLen {
		t.Fatalf("first request = %+v, want a new %d-character code", first, CodeLen)
	}
	for _, r := range first.Code {
		if !strings.ContainsRune(CodeAlphabet, r) {
			t.Fatalf("code %q has %q outside the alphabet", first.Code, r)
		}
	}
	c.Advance(time.Minute)
	second, err := s.Request(alice())
	if err != nil || second.Action != ActionRemind || second.Code != first.Code {
		t.Fatalf("second request = %+v, %v; want a reminder of %s", second, err, first.Code)
	}
	for i := range 5 {
		c.Advance(time.Minute)
		again, err := s.Request(alice())
		if err != nil || again.Action != ActionNone {
			t.Fatalf("request %d = %+v, %v; want nothing", i+3, again, err)
		}
	}
	// After the TTL the sender may get a fresh code, different from the old.
	c.Advance(CodeTTL)
	fresh, err := s.Request(alice())
	if err != nil || fresh.Action != ActionNewCode || fresh.Code == first.Code {
		t.Fatalf("after expiry = %+v, %v; want a different new code", fresh, err)
	}
	ps, err := s.List()
	if err != nil || len(ps) != 1 || ps[0].Code != fresh.Code {
		t.Fatalf("pending = %+v, %v; want only the fresh code", ps, err)
	}
}

func TestApprove(t *testing.T) {
	tests := []struct {
		name    string
		wait    time.Duration
		code    func(issued string) string
		wantErr error
		wantMsg []string
	}{
		{name: "live code", code: func(c string) string { return c }},
		{name: "typed in lower case with a dash", code: func(c string) string { return strings.ToLower(c[:4] + "-" + c[4:]) }},
		{name: "expired", wait: CodeTTL + 3*time.Minute, code: func(c string) string { return c },
			wantErr: ErrCodeExpired, wantMsg: []string{"expired 3m0s ago", "valid for 10m0s", "message the bot again"}},
		{name: "just expired", wait: CodeTTL, code: func(c string) string { return c }, wantErr: ErrCodeExpired},
		{name: "unknown", code: func(string) string { return "ABCDEFGH" }, wantErr: ErrUnknownCode, wantMsg: []string{"gpuhost pair list"}},
		{name: "malformed", code: func(string) string { return "O0I1" }, wantErr: ErrMalformedCode},
		{name: "ambiguous character", code: func(string) string { return "ABCDEFG0" }, wantErr: ErrMalformedCode},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, c := newStore(t)
			out, err := s.Request(alice())
			if err != nil {
				t.Fatal(err)
			}
			c.Advance(tc.wait)
			e, err := s.Approve(tc.code(out.Code))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Approve error = %v, want %v", err, tc.wantErr)
				}
				for _, w := range tc.wantMsg {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				if ok, err := s.Allowed(1001); ok || err != nil {
					t.Errorf("Allowed after refused approval = %v, %v", ok, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.UserID != 1001 || e.ChatID != 1001 || e.Username != "alice" || !e.ApprovedAt.Equal(c.Now()) {
				t.Errorf("entry = %+v", e)
			}
			if ok, err := s.Allowed(1001); !ok || err != nil {
				t.Errorf("Allowed = %v, %v", ok, err)
			}
			if ps, _ := s.List(); len(ps) != 0 {
				t.Errorf("approved code still pending: %+v", ps)
			}
			if _, err := s.Approve(out.Code); !errors.Is(err, ErrUnknownCode) {
				t.Errorf("second approval of the same code = %v, want ErrUnknownCode", err)
			}
		})
	}
}

func TestRevoke(t *testing.T) {
	s, _ := newStore(t)
	out, _ := s.Request(alice())
	if _, err := s.Approve(out.Code); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke(42); !errors.Is(err, ErrNotAllowlisted) {
		t.Errorf("revoke unknown = %v", err)
	}
	e, err := s.Revoke(1001)
	if err != nil || e.UserID != 1001 {
		t.Fatalf("revoke = %+v, %v", e, err)
	}
	if ok, err := s.Allowed(1001); ok || err != nil {
		t.Errorf("Allowed after revoke = %v, %v", ok, err)
	}
}

func TestFilesArePrivateAndWellFormed(t *testing.T) {
	s, _ := newStore(t)
	out, _ := s.Request(alice())
	if _, err := s.Approve(out.Code); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{s.AllowlistPath(), s.PendingPath()} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, st.Mode().Perm())
		}
	}
	if st, _ := os.Stat(s.Dir); st.Mode().Perm() != 0o700 {
		t.Errorf("%s mode %v, want 0700", s.Dir, st.Mode().Perm())
	}
	data, _ := os.ReadFile(s.AllowlistPath())
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil || raw["version"] != float64(1) {
		t.Errorf("allowlist.json = %s (%v)", data, err)
	}
}

func TestCorruptFilesFailClosedAndAreNotOverwritten(t *testing.T) {
	cases := []struct{ name, content, want string }{
		{"empty", "", "empty"},
		{"not json", "add me please", "corrupt file"},
		{"truncated", `{"version":1,"users":[{"user_id":5`, "corrupt file"},
		{"wrong version", `{"version":2,"users":[]}`, "unsupported version 2"},
		{"unknown field", `{"version":1,"users":[],"admin":true}`, "unknown field"},
		{"zero id", `{"version":1,"users":[{"user_id":0,"chat_id":1}]}`, "user_id 0"},
		{"duplicate", `{"version":1,"users":[{"user_id":5,"chat_id":5},{"user_id":5,"chat_id":5}]}`, "listed twice"},
		{"trailing data", `{"version":1,"users":[]} {"version":1}`, "data after"},
		{"control chars in name", `{"version":1,"users":[{"user_id":5,"chat_id":5,"username":"a\u001b[2Jb"}]}`, "control characters"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t)
			out, err := s.Request(Sender{UserID: 5, ChatID: 5})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(s.AllowlistPath(), []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			ok, err := s.Allowed(5)
			if ok || err == nil {
				t.Fatalf("Allowed on a corrupt allowlist = %v, %v; want false with an error", ok, err)
			}
			for _, w := range []string{s.AllowlistPath(), tc.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, err := s.Approve(out.Code); err == nil || !strings.Contains(err.Error(), "not changing it") {
				t.Errorf("Approve over a corrupt allowlist = %v", err)
			}
			if _, err := s.Revoke(5); err == nil {
				t.Error("Revoke over a corrupt allowlist succeeded")
			}
			if got, _ := os.ReadFile(s.AllowlistPath()); string(got) != tc.content {
				t.Error("corrupt allowlist was overwritten")
			}
		})
	}
}

func TestCorruptPendingIsAnErrorNamingTheFile(t *testing.T) {
	s, _ := newStore(t)
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.PendingPath(), []byte(`{"version":1,"pending":[{"code":"abc"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Request": func() error { _, err := s.Request(alice()); return err }(),
		"Approve": func() error { _, err := s.Approve("ABCDEFGH"); return err }(),
		"List":    func() error { _, err := s.List(); return err }(),
	} {
		if err == nil || !strings.Contains(err.Error(), s.PendingPath()) {
			t.Errorf("%s on corrupt pending.json = %v; want an error naming the file", name, err)
		}
	}
}

func TestMissingFilesAreEmpty(t *testing.T) {
	s, _ := newStore(t)
	if ok, err := s.Allowed(1); ok || err != nil {
		t.Errorf("Allowed = %v, %v", ok, err)
	}
	if ps, err := s.List(); len(ps) != 0 || err != nil {
		t.Errorf("List = %v, %v", ps, err)
	}
	if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("reading created %s", s.Dir)
	}
}

func TestFloodIsRateLimitedAndEvictsTheOldest(t *testing.T) {
	s, c := newStore(t)
	req := func(id int64) (Outcome, error) { return s.Request(Sender{UserID: id, ChatID: id}) }
	// Global rate: NewCodesPerMinute new codes in a minute, then none.
	for i := range NewCodesPerMinute {
		if out, err := req(int64(10 + i)); err != nil || out.Action != ActionNewCode {
			t.Fatalf("request %d = %+v, %v", i, out, err)
		}
	}
	if _, err := req(4999); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("request beyond the rate = %v, want ErrRateLimited", err)
	}
	if ws := s.Waiting(); len(ws) != 1 || ws[0].UserID != 4999 {
		t.Fatalf("waiting = %+v; want the refused sender in line", ws)
	}
	// Reminders are not new codes: they are still answered.
	if out, err := req(10); err != nil || out.Action != ActionRemind {
		t.Fatalf("reminder during the rate limit = %+v, %v", out, err)
	}
	// A minute on, the sender in line gets the freed code.
	c.Advance(time.Minute)
	if out, err := req(4999); err != nil || out.Action != ActionNewCode {
		t.Fatalf("the waiting sender a minute on = %+v, %v; want a code", out, err)
	}
	// Fill the live cap at the highest rate allowed.
	c.Advance(time.Minute)
	for i := NewCodesPerMinute; i < MaxLivePending-1; i++ {
		c.Advance(time.Minute / NewCodesPerMinute)
		if out, err := req(int64(10 + i)); err != nil || out.Action != ActionNewCode || len(out.Evicted) != 0 {
			t.Fatalf("request %d = %+v, %v", i, out, err)
		}
	}
	ps, _ := s.List()
	oldest := ps[0]
	// The cap is full: a newcomer still gets a code, and the oldest live
	// code is evicted. It had at least MaxLivePending/NewCodesPerMinute.
	c.Advance(time.Minute / NewCodesPerMinute)
	out, err := req(5000)
	if err != nil || out.Action != ActionNewCode || !slices.Equal(out.Evicted, []int64{oldest.UserID}) {
		t.Fatalf("newcomer at the cap = %+v, %v; want a code evicting user %d", out, err, oldest.UserID)
	}
	if age := c.Now().Sub(oldest.CreatedAt); age < 5*time.Minute {
		t.Errorf("a code was evicted %s after it was issued, want ≥ 5 min", age)
	}
	if _, err := s.Approve(oldest.Code); !errors.Is(err, ErrCodeEvicted) || !strings.Contains(err.Error(), "message the bot again") {
		t.Errorf("approve of an evicted code = %v, want ErrCodeEvicted saying what to do", err)
	}
	// The evicted sender gets nothing until their code would have expired.
	if out, err := req(oldest.UserID); err != nil || out.Action != ActionNone {
		t.Errorf("evicted sender again = %+v, %v; want silence", out, err)
	}
	c.Advance(CodeTTL)
	if out, err := req(oldest.UserID); err != nil || out.Action != ActionNewCode {
		t.Errorf("evicted sender after the TTL = %+v, %v; want a new code", out, err)
	}
	live := 0
	ps, _ = s.List()
	for _, p := range ps {
		if p.Live(c.Now()) {
			live++
		}
	}
	if live > MaxLivePending {
		t.Errorf("%d live codes, cap %d", live, MaxLivePending)
	}
}

func TestExpiredCodesArePruned(t *testing.T) {
	s, c := newStore(t)
	if _, err := s.Request(Sender{UserID: 5000, ChatID: 5000}); err != nil {
		t.Fatal(err)
	}
	c.Advance(CodeTTL)
	if _, err := s.Request(Sender{UserID: 5001, ChatID: 5001}); err != nil {
		t.Fatal(err)
	}
	c.Advance(KeepExpired + time.Minute)
	if _, err := s.Request(Sender{UserID: 5002, ChatID: 5002}); err != nil {
		t.Fatal(err)
	}
	// Left: 5001's code (expired less than KeepExpired ago) and 5002's.
	if ps, _ := s.List(); len(ps) != 2 || ps[0].UserID != 5001 || ps[1].UserID != 5002 {
		t.Errorf("codes on file after pruning: %+v, want those of 5001 and 5002", ps)
	}
}

// worstName is a 64-rune name whose every rune JSON escapes to 6 bytes.
var worstName = strings.Repeat("<", 64)

// A sustained flood of senders with the longest names at the highest rate
// keeps pending.json bounded: expired codes are pruned on every write. On
// the code before, expired codes were kept 24 h, so the file grew by ~1 KiB
// per sender and outgrew the readers' 1 MiB limit after ~1,100 of them,
// breaking pairing for good (TestOversizedPendingIsReadAndPruned).
func TestPendingFileStaysBoundedUnderAFlood(t *testing.T) {
	s, c := newStore(t)
	const senders = MaxKeptExpired + MaxLivePending + 120
	biggest := int64(0)
	for i := range senders {
		c.Advance(time.Minute / NewCodesPerMinute)
		out, err := s.Request(Sender{UserID: int64(100 + i), ChatID: int64(100 + i), Username: worstName, FirstName: worstName})
		if err != nil || out.Action != ActionNewCode {
			t.Fatalf("sender %d: %+v, %v", i, out, err)
		}
		if i%50 == 0 || i == senders-1 {
			fi, err := os.Stat(s.PendingPath())
			if err != nil {
				t.Fatal(err)
			}
			biggest = max(biggest, fi.Size())
		}
	}
	if biggest >= MaxFileBytes/2 {
		t.Errorf("pending.json grew to %d bytes, want well under %d", biggest, MaxFileBytes)
	}
	ps, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	dead := 0
	for _, p := range ps {
		if !p.Live(c.Now()) {
			dead++
		}
	}
	if dead > MaxKeptExpired || len(ps) > MaxKeptExpired+MaxLivePending {
		t.Errorf("%d codes on file (%d expired or evicted)", len(ps), dead)
	}
	// The newest expired ones are the ones kept.
	if i := slices.IndexFunc(ps, func(p Pending) bool { return p.UserID == 100+senders-1 }); i < 0 {
		t.Error("the newest code is gone")
	}
}

// A pending.json that outgrew the old 1 MiB read limit (written by an older
// gpuhost) is read, not refused, and pruned by the next write.
func TestOversizedPendingIsReadAndPruned(t *testing.T) {
	s, c := newStore(t)
	var f pendingFile
	f.Version = fileVersion
	for i := range 2500 {
		f.Pending = append(f.Pending, Pending{Code: fmt.Sprintf("%08d", i), UserID: int64(100 + i), ChatID: int64(100 + i),
			Username: worstName, FirstName: worstName, CreatedAt: c.Now().Add(-time.Hour - time.Duration(i)*time.Second).UTC()})
	}
	codes := "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
	for i := range f.Pending {
		b := []byte(f.Pending[i].Code)
		for j := range b {
			b[j] = codes[(int(b[j]-'0')*7+j+i)%len(codes)]
		}
		f.Pending[i].Code = string(b)
		for j := range i { // unique codes
			if f.Pending[j].Code == f.Pending[i].Code {
				t.Fatalf("test codes collide")
			}
		}
	}
	data, _ := json.Marshal(f)
	if len(data) <= MaxFileBytes {
		t.Fatalf("test file is only %d bytes", len(data))
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.PendingPath(), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if ps, err := s.List(); err != nil || len(ps) != 2500 {
		t.Fatalf("List of a %d-byte file = %d codes, %v", len(data), len(ps), err)
	}
	out, err := s.Request(alice())
	if err != nil || out.Action != ActionNewCode {
		t.Fatalf("Request with a %d-byte file = %+v, %v", len(data), out, err)
	}
	if _, err := s.Approve(out.Code); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(s.PendingPath())
	if err != nil || fi.Size() >= MaxFileBytes/2 {
		t.Fatalf("pending.json after a write: %v, %v", fi.Size(), err)
	}
	if ps, _ := s.List(); len(ps) != MaxKeptExpired {
		t.Errorf("%d codes kept, want the newest %d expired ones", len(ps), MaxKeptExpired)
	}
}

func TestPurge(t *testing.T) {
	s, c := newStore(t)
	for i := range 3 {
		if _, err := s.Request(Sender{UserID: int64(10 + i), ChatID: int64(10 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	c.Advance(CodeTTL)
	live, _ := s.Request(alice())
	if n, err := s.Purge(false); err != nil || n != 3 {
		t.Fatalf("Purge = %d, %v; want the 3 expired codes", n, err)
	}
	if ps, _ := s.List(); len(ps) != 1 || ps[0].Code != live.Code {
		t.Fatalf("after purge: %+v", ps)
	}
	if n, err := s.Purge(true); err != nil || n != 1 {
		t.Fatalf("Purge(all) = %d, %v", n, err)
	}
	if ps, err := s.List(); len(ps) != 0 || err != nil {
		t.Fatalf("after purge --all: %+v, %v", ps, err)
	}
	// A corrupt file: only --all replaces it.
	if err := os.WriteFile(s.PendingPath(), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Purge(false); err == nil || !strings.Contains(err.Error(), "--all") {
		t.Errorf("Purge of a corrupt file = %v, want an error pointing to --all", err)
	}
	if n, err := s.Purge(true); err != nil || n != -1 {
		t.Errorf("Purge(all) of a corrupt file = %d, %v", n, err)
	}
	if out, err := s.Request(alice()); err != nil || out.Action != ActionNewCode {
		t.Errorf("Request after the purge = %+v, %v", out, err)
	}
}

func TestConcurrentRequestsAndApprovalsLoseNothing(t *testing.T) {
	s, _ := newStore(t)
	first, _ := s.Request(alice())
	var wg sync.WaitGroup
	const n = NewCodesPerMinute - 1 // with alice's, the most in a minute
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Request(Sender{UserID: int64(2000 + i), ChatID: int64(2000 + i)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := s.Approve(first.Code); err != nil {
			t.Error(err)
		}
	}()
	wg.Wait()
	ps, err := s.List()
	if err != nil || len(ps) != n {
		t.Fatalf("%d pending (%v), want the %d concurrent ones", len(ps), err, n)
	}
	if ok, _ := s.Allowed(1001); !ok {
		t.Error("concurrent approval lost")
	}
}

func TestCleanName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"alice", "alice"},
		{"Al\x1b[31mice", "Al[31mice"},
		{"evil\u202Eexe.txt", "evilexe.txt"},
		{"bad\xffutf8", "bad\uFFFDutf8"},
		{"line\nbreak", "linebreak"},
		{strings.Repeat("é", 70), strings.Repeat("é", 64) + "…"},
	}
	for _, tc := range tests {
		if got := CleanName(tc.in); got != tc.want {
			t.Errorf("CleanName(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := CleanName(CleanName(tc.in)); got != CleanName(tc.in) {
			t.Errorf("CleanName not idempotent on %q", tc.in)
		}
	}
}

func TestStoredNamesAreCleaned(t *testing.T) {
	s, _ := newStore(t)
	if _, err := s.Request(Sender{UserID: 7, ChatID: 7, Username: "x\x1b]0;pwned\x07", FirstName: "\u202Egnp.exe"}); err != nil {
		t.Fatal(err)
	}
	ps, err := s.List()
	if err != nil || len(ps) != 1 {
		t.Fatal(ps, err)
	}
	if ps[0].Username != "x]0;pwned" || ps[0].FirstName != "gnp.exe" {
		t.Errorf("stored names %q %q", ps[0].Username, ps[0].FirstName)
	}
}

func FuzzParseAllowlist(f *testing.F) {
	f.Add([]byte(`{"version":1,"users":[{"user_id":5,"chat_id":5,"username":"a","approved_at":"2026-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"version":1,"users":null}`))
	f.Add([]byte(`{"version":1,"users":[{"user_id":-1,"chat_id":5}]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseAllowlist("allowlist.json", data)
		if err != nil {
			if !strings.Contains(err.Error(), "allowlist.json") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		seen := map[int64]bool{}
		for _, e := range a.Users {
			if e.UserID <= 0 || seen[e.UserID] {
				t.Fatalf("accepted invalid or duplicate user %d", e.UserID)
			}
			seen[e.UserID] = true
		}
		// What was accepted survives a write and a read unchanged.
		out, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ParseAllowlist("allowlist.json", out)
		if err != nil {
			t.Fatalf("re-read of %s: %v", out, err)
		}
		if again, _ := json.Marshal(b); !bytes.Equal(again, out) {
			t.Fatalf("round trip changed %s into %s", out, again)
		}
	})
}

func FuzzParsePending(f *testing.F) {
	f.Add([]byte(`{"version":1,"pending":[{"code":"ABCDEFGH","user_id":5,"chat_id":5,"created_at":"2026-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"version":1,"pending":[{"code":"abcdefgh","user_id":5,"chat_id":5,"created_at":"2026-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"pending":[{"code":"ABCDEFGH","user_id":5,"chat_id":5,"created_at":"bad"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := ParsePending("pending.json", data)
		if err != nil {
			if !strings.Contains(err.Error(), "pending.json") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for _, p := range ps {
			if c, err := NormalizeCode(p.Code); err != nil || c != p.Code {
				t.Fatalf("accepted bad code %q", p.Code)
			}
		}
		out, err := json.Marshal(pendingFile{Version: fileVersion, Pending: ps})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParsePending("pending.json", out); err != nil {
			t.Fatalf("re-read of %s: %v", out, err)
		}
	})
}

func FuzzNormalizeCode(f *testing.F) {
	for _, s := range []string{"ABCDEFGH", "abcd-efgh", " ab cd ef gh ", "ABCDEFG0", "", "ÄBCDEFGH"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := NormalizeCode(s)
		if err != nil {
			return
		}
		if len(c) != CodeLen {
			t.Fatalf("NormalizeCode(%q) = %q", s, c)
		}
		if again, err := NormalizeCode(c); err != nil || again != c {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", s, c, again, err)
		}
	})
}

func ExampleNormalizeCode() {
	c, _ := NormalizeCode("abcd-efgh")
	fmt.Println(c, filepath.Base(New("/var/lib/gpuhost").AllowlistPath()))
	// Output: ABCDEFGH allowlist.json
}

// TestLineMovesWithoutWriters: after the rate is used up, a sender in line
// gets the next freed code from HandOut (the bot's own clock) although no
// one writes again; an empty line hands out nothing.
func TestLineMovesWithoutWriters(t *testing.T) {
	s, c := newStore(t)
	if g, err := s.HandOut(); err != nil || len(g) != 0 {
		t.Fatalf("empty line: HandOut = %v, %v", g, err)
	}
	for i := range NewCodesPerMinute {
		if out, err := s.Request(Sender{UserID: int64(10 + i), ChatID: int64(10 + i)}); err != nil || out.Action != ActionNewCode {
			t.Fatalf("sender %d: %+v, %v", i, out, err)
		}
	}
	if _, err := s.Request(Sender{UserID: 500, ChatID: 501}); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("past the rate: %v, want ErrRateLimited", err)
	}
	if g, err := s.HandOut(); err != nil || len(g) != 0 {
		t.Fatalf("within the minute: HandOut = %v, %v", g, err)
	}
	c.Advance(time.Minute + time.Second)
	g, err := s.HandOut()
	if err != nil || len(g) != 1 || g[0].UserID != 500 || g[0].ChatID != 501 || g[0].Code == "" {
		t.Fatalf("a minute later: HandOut = %+v, %v; want one code for user 500", g, err)
	}
	pend, err := s.List()
	if err != nil || !slices.ContainsFunc(pend, func(p Pending) bool { return p.UserID == 500 && p.Code == g[0].Code }) {
		t.Fatalf("the handed-out code is not on file: %+v, %v", pend, err)
	}
	if g, err := s.HandOut(); err != nil || len(g) != 0 {
		t.Fatalf("line empty again: HandOut = %v, %v", g, err)
	}
}
