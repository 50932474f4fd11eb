package pairing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T) (*Store, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
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
	c.Add(time.Minute)
	second, err := s.Request(alice())
	if err != nil || second.Action != ActionRemind || second.Code != first.Code {
		t.Fatalf("second request = %+v, %v; want a reminder of %s", second, err, first.Code)
	}
	for i := range 5 {
		c.Add(time.Minute)
		again, err := s.Request(alice())
		if err != nil || again.Action != ActionNone {
			t.Fatalf("request %d = %+v, %v; want nothing", i+3, again, err)
		}
	}
	// After the TTL the sender may get a fresh code, different from the old.
	c.Add(CodeTTL)
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
			c.Add(tc.wait)
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
		{"too large", `{"version":1,"users":[]}` + strings.Repeat(" ", MaxFileBytes), "too large"},
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

func TestFloodIsCapped(t *testing.T) {
	s, c := newStore(t)
	for i := range MaxLivePending {
		if out, err := s.Request(Sender{UserID: int64(10 + i), ChatID: int64(10 + i)}); err != nil || out.Action != ActionNewCode {
			t.Fatalf("request %d = %+v, %v", i, out, err)
		}
	}
	if _, err := s.Request(Sender{UserID: 5000, ChatID: 5000}); !errors.Is(err, ErrTooManyPending) {
		t.Fatalf("request beyond the cap = %v, want ErrTooManyPending", err)
	}
	// Expired codes no longer count, and are pruned after KeepExpired.
	c.Add(CodeTTL)
	if out, err := s.Request(Sender{UserID: 5000, ChatID: 5000}); err != nil || out.Action != ActionNewCode {
		t.Fatalf("request after expiry = %+v, %v", out, err)
	}
	c.Add(KeepExpired + time.Minute)
	if _, err := s.Request(Sender{UserID: 5001, ChatID: 5001}); err != nil {
		t.Fatal(err)
	}
	// Left: 5000's code (expired less than KeepExpired ago) and 5001's.
	if ps, _ := s.List(); len(ps) != 2 || ps[0].UserID != 5000 || ps[1].UserID != 5001 {
		t.Errorf("codes on file after pruning: %+v, want those of 5000 and 5001", ps)
	}
}

func TestConcurrentRequestsAndApprovalsLoseNothing(t *testing.T) {
	s, _ := newStore(t)
	first, _ := s.Request(alice())
	var wg sync.WaitGroup
	for i := range 20 {
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
	if err != nil || len(ps) != 20 {
		t.Fatalf("%d pending (%v), want the 20 concurrent ones", len(ps), err)
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
