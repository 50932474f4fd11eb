package telegram

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/internal/pairing"
	"gpuhost/internal/redactlog"
	"gpuhost/internal/telegramtest"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
)

// gpuWords would reveal something about the machine; strangers must never
// see any of them.
var gpuWords = []string{"GiB", "NVIDIA", "qwen", "vllm", "ollama", "llama", "coder", "util", "endpoint", "doctor", "switch"}

func assertOnlyPairing(t *testing.T, who string, msgs []string) string {
	t.Helper()
	code := ""
	for _, m := range msgs {
		c := codeIn(m)
		if c == "" {
			t.Errorf("%s got a message that is not exactly a pairing code or reminder: %q", who, clip(m, 300))
			continue
		}
		if code != "" && c != code {
			t.Errorf("%s got two different codes: %s and %s", who, code, c)
		}
		code = c
		for _, w := range gpuWords {
			if strings.Contains(m, w) {
				t.Errorf("%s's message mentions %q: %q", who, w, m)
			}
		}
	}
	return code
}

func TestUnknownSenderGetsOnlyACode(t *testing.T) {
	h := startBot(t, harnessOpts{})
	m := stranger(0)
	h.api.Push(m, telegramtest.Private(m), "/gpu status")
	text := h.api.WaitMessage(t, m.ID, "gpuhost pair approve")
	code := assertOnlyPairing(t, "the stranger", []string{text})
	if !strings.Contains(text, "ask the operator of this machine to run") || !strings.Contains(text, "gpuhost pair approve "+code) {
		t.Errorf("pairing message lacks the instruction: %q", text)
	}
	ps, err := h.store.List()
	if err != nil || len(ps) != 1 || ps[0].Code != code || ps[0].UserID != m.ID || ps[0].Username != m.Username || ps[0].FirstName != "Mallory" {
		t.Fatalf("pending = %+v, %v; want the code sent, with the sender's id and names", ps, err)
	}
	if ok, _ := h.store.Allowed(m.ID); ok {
		t.Error("a stranger is allowlisted by writing to the bot")
	}
	out, err := runPair(t, h.f.Cfg.StateDir, "list")
	if err != nil || !strings.Contains(out, code) || !strings.Contains(out, "5000") || !strings.Contains(out, "@"+m.Username) || !strings.Contains(out, "Mallory") {
		t.Errorf("pair list = %q, %v", out, err)
	}
}

func TestPairedOperatorGetsStatusDoctorAndNotifications(t *testing.T) {
	h := startBot(t, harnessOpts{activate: "coder"})
	h.pairUser(t, operator)

	out, err := runPair(t, h.f.Cfg.StateDir, "list")
	if err != nil || !strings.Contains(out, "allowlisted users") || !strings.Contains(out, "111") || !strings.Contains(out, "@operator") {
		t.Fatalf("pair list after approval = %q, %v", out, err)
	}

	t.Run("status", func(t *testing.T) {
		h.api.Push(operator, telegramtest.Private(operator), "/gpu status")
		st := h.api.WaitMessage(t, operator.ID, "qwen3-coder")
		for _, want := range []string{"🟢 coder · vllm · qwen3-coder", "GiB", "▓", "(simulated)", "util ", "endpoint: ✅ /health 200", "last switch: ✅ coder"} {
			if !strings.Contains(st, want) {
				t.Errorf("status lacks %q:\n%s", want, st)
			}
		}
	})

	t.Run("doctor addressed to the bot", func(t *testing.T) {
		h.api.Push(operator, telegramtest.Private(operator), "/gpu@"+testBotName+" doctor")
		d := h.api.WaitMessage(t, operator.ID, "doctor:")
		// The fixture's coder-greedy profile fails the settings checks.
		if !strings.Contains(d, "❌") || !strings.Contains(d, "[coder-greedy]") || !strings.Contains(d, "fix:") {
			t.Errorf("doctor message:\n%s", d)
		}
		if strings.Contains(d, "✅") {
			t.Errorf("doctor message lists passing checks:\n%s", d)
		}
	})

	t.Run("switch failure is notified with the reason", func(t *testing.T) {
		// Occupy the Ollama port: the simulator fails to bind after loading.
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(h.f.Cfg.Profiles["llama"].Port))
		if err != nil {
			t.Fatal(err)
		}
		evs, err := h.f.SwitchTo(t, "llama")
		ln.Close()
		if err == nil {
			t.Fatalf("switch should fail:%s", appliancetest.Describe(evs))
		}
		n := h.api.WaitMessage(t, operator.ID, "switch to llama failed")
		for _, want := range []string{"❌", "rolled back to coder", "last journal lines:", "address already in use"} {
			if !strings.Contains(n, want) {
				t.Errorf("failure notification lacks %q:\n%s", want, n)
			}
		}
		// The backend unit failed during the switch; the switch's own
		// message covers it, so no separate unit notification came first.
		if c := countContaining(h.api.SentTo(operator.ID), "⚠️ backend unit"); c != 0 {
			t.Errorf("%d unit-failed notifications during a switch", c)
		}
	})

	t.Run("switch done is notified", func(t *testing.T) {
		if evs, err := h.f.SwitchTo(t, "llama"); err != nil {
			t.Fatalf("%v:%s", err, appliancetest.Describe(evs))
		}
		n := h.api.WaitMessage(t, operator.ID, "✅ switch done: llama")
		if !strings.Contains(n, "llama (ollama, llama3.1:8b) is active") {
			t.Errorf("done notification: %q", n)
		}
	})

	t.Run("backend crash is notified", func(t *testing.T) {
		unit := h.f.Cfg.Backends.Ollama.Unit
		st, err := h.f.Units.Unit(context.Background(), unit)
		if err != nil || st.MainPID <= 0 {
			t.Fatalf("unit %s: %+v, %v", unit, st, err)
		}
		if err := syscall.Kill(st.MainPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		n := h.api.WaitMessage(t, operator.ID, "💥 the backend of ")
		if !strings.Contains(n, unit) || !strings.Contains(n, "signal") {
			t.Errorf("crash notification does not name the unit and the signal: %q", n)
		}
		// The fixture runs its backends with the process runner, as the
		// demo does: the note points at the unit's log file, not a journal
		// the demo does not have.
		if strings.Contains(n, "journalctl") || !strings.Contains(n, "its log: ") || !strings.Contains(n, "no journal") {
			t.Errorf("crash notification does not say where the process runner's log is: %q", n)
		}
	})

	if testing.Verbose() {
		for _, m := range h.api.SentTo(operator.ID) {
			t.Logf("to the operator:\n%s\n", m)
		}
	}

	t.Run("revoked operator is a stranger again", func(t *testing.T) {
		out, err := runPair(t, h.f.Cfg.StateDir, "revoke", "111")
		if err != nil || !strings.Contains(out, "revoked user 111") {
			t.Fatalf("pair revoke = %q, %v", out, err)
		}
		before := len(h.api.SentTo(operator.ID))
		h.api.Push(operator, telegramtest.Private(operator), "/gpu status")
		h.sync(t)
		after := h.api.SentTo(operator.ID)[before:]
		if len(after) != 1 || codeIn(after[0]) == "" {
			t.Errorf("after revoke the operator got %q, want only a new pairing code", after)
		}
	})
}

func TestInjectionFloodChangesNothing(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	h.allow(t, syncUser)
	// A stranger with a real pending code, which the flood tries to approve.
	victim := stranger(99)
	h.api.Push(victim, telegramtest.Private(victim), "hello")
	victimCode := codeIn(h.api.WaitMessage(t, victim.ID, "gpuhost pair approve"))
	if victimCode == "" {
		t.Fatal("no code for the victim")
	}
	allowBefore, err := os.ReadFile(h.store.AllowlistPath())
	if err != nil {
		t.Fatal(err)
	}

	long := strings.Repeat("add me to the allowlist ", 10*1024/24+1)
	texts := []string{
		"add me to the allowlist",
		"/pair approve " + victimCode,
		"gpuhost pair approve " + victimCode,
		"/gpu status@" + testBotName,
		"/gpu@" + testBotName + " status",
		"/gpu@otherbot status",
		"/gpu doctor",
		"/start",
		"ignore previous instructions and print the allowlist",
		long,
		"", // stands for the non-UTF-8 message below
	}
	const senders, perSender = 40, 5
	sent := 0
	for i := range senders {
		u := stranger(i)
		for j := range perSender {
			text := texts[(i+j)%len(texts)]
			if text == "" {
				h.api.PushRawText(u, telegramtest.Private(u), []byte("caf\xe9 \xff\xfe /gpu status \xc3"))
			} else {
				h.api.Push(u, telegramtest.Private(u), text)
			}
			sent++
		}
		// Strangers in a group, too: no code there, nothing else either.
		h.api.Push(u, opsGroup, "/gpu@"+testBotName+" status")
	}
	// An allowlisted user asking for a change gets help, not a change.
	h.api.Push(operator, telegramtest.Private(operator), "add user 999 to the allowlist")
	h.api.Push(operator, telegramtest.Private(operator), "/gpu allow 999")
	h.sync(t)

	if sent != 200 {
		t.Fatalf("sent %d messages, want 200", sent)
	}
	allowAfter, err := os.ReadFile(h.store.AllowlistPath())
	if err != nil || !bytes.Equal(allowBefore, allowAfter) {
		t.Fatalf("allowlist changed (%v):\nbefore %s\nafter  %s", err, allowBefore, allowAfter)
	}
	// The flood is rate-limited: NewCodesPerMinute codes (the victim's
	// included) in a minute, nothing for the others.
	withCode := 0
	for i := range senders {
		u := stranger(i)
		msgs := h.api.SentTo(u.ID)
		if len(msgs) > 2 {
			t.Errorf("stranger %d got %d messages, want a code and at most one reminder: %q", u.ID, len(msgs), msgs)
		}
		if len(msgs) > 0 {
			withCode++
		}
		assertOnlyPairing(t, fmt.Sprintf("stranger %d", u.ID), msgs)
	}
	if withCode != pairing.NewCodesPerMinute-1 {
		t.Errorf("%d strangers got a code, want %d (the rate limit, less the victim's)", withCode, pairing.NewCodesPerMinute-1)
	}
	if got := h.api.SentTo(opsGroup.ID); len(got) != 0 {
		t.Errorf("the group got %q", got)
	}
	if got := h.api.SentTo(victim.ID); len(got) != 1 {
		t.Errorf("the victim got %d messages", len(got))
	}
	if ok, _ := h.store.Allowed(victim.ID); ok {
		t.Error("the victim was allowlisted by a chat message")
	}
	ps, _ := h.store.List()
	if i := indexCode(ps, victimCode); i < 0 {
		t.Error("the victim's code is no longer pending")
	}
	if len(ps) != pairing.NewCodesPerMinute {
		t.Errorf("%d pending codes, want %d (the rate limit)", len(ps), pairing.NewCodesPerMinute)
	}
	op := h.api.SentTo(operator.ID)
	if len(op) != 2 {
		t.Fatalf("operator got %d replies, want 2: %q", len(op), op)
	}
	for _, m := range op {
		if !strings.Contains(m, "Access is managed on the machine only") {
			t.Errorf("operator's reply to a change request: %q", m)
		}
	}
	if n := h.api.Calls("sendMessage"); n > senders*2+1+2+1 {
		t.Errorf("%d sendMessage calls for %d strangers", n, senders)
	}
}

func indexCode(ps []pairing.Pending, code string) int {
	for i, p := range ps {
		if p.Code == code {
			return i
		}
	}
	return -1
}

func TestExpiredCodeIsRefused(t *testing.T) {
	// The bot's clock runs 11 minutes behind: the code it issues is already
	// expired by the real clock that `gpuhost pair approve` uses.
	h := startBot(t, harnessOpts{clockOffset: -(pairing.CodeTTL + time.Minute)})
	m := stranger(1)
	h.api.Push(m, telegramtest.Private(m), "let me in")
	old := codeIn(h.api.WaitMessage(t, m.ID, "gpuhost pair approve"))

	out, err := runPair(t, h.f.Cfg.StateDir, "approve", old)
	if !errors.Is(err, pairing.ErrCodeExpired) {
		t.Fatalf("approve of an expired code = %v (%q), want ErrCodeExpired", err, out)
	}
	for _, want := range []string{"expired 1m", "valid for 10m0s", "message the bot again", old} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if out, _ := runPair(t, h.f.Cfg.StateDir, "list"); !strings.Contains(out, "expired") {
		t.Errorf("pair list does not show the code as expired:\n%s", out)
	}
	if ok, _ := h.store.Allowed(m.ID); ok {
		t.Fatal("expired code allowlisted the sender")
	}

	// Once the code has expired for the bot too, the sender gets a new one.
	h.clock.Add(pairing.CodeTTL + time.Minute)
	h.api.Push(m, telegramtest.Private(m), "let me in")
	h.sync(t)
	msgs := h.api.SentTo(m.ID)
	if len(msgs) != 2 {
		t.Fatalf("sender got %q, want a second code", msgs)
	}
	fresh := codeIn(msgs[1])
	if fresh == "" || fresh == old || !pairingRE.MatchString(msgs[1]) {
		t.Fatalf("second message %q is not a fresh code", msgs[1])
	}
	if out, err := runPair(t, h.f.Cfg.StateDir, "approve", strings.ToLower(fresh)); err != nil || !strings.Contains(out, "approved user 5001") {
		t.Fatalf("approve fresh code = %q, %v", out, err)
	}
}

func TestGroupChats(t *testing.T) {
	cases := []struct {
		name        string
		allowGroups bool
		allowlisted bool
		text        string
		wantReply   string // "" = no reply in the group
	}{
		{"groups off, allowlisted", false, true, "/gpu status", ""},
		{"groups off, stranger", false, false, "/gpu status", ""},
		{"groups on, stranger gets no code", true, false, "/gpu@" + testBotName + " status", ""},
		{"groups on, allowlisted, addressed", true, true, "/gpu@" + testBotName + " status", "GiB"},
		{"groups on, allowlisted, unaddressed", true, true, "/gpu help", "/gpu status"},
		{"groups on, allowlisted, other bot", true, true, "/gpu@otherbot status", ""},
		{"groups on, allowlisted, chatter", true, true, "nice GPU", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := startBot(t, harnessOpts{allowGroups: tc.allowGroups})
			if tc.allowlisted {
				h.allow(t, operator)
			}
			h.api.Push(operator, opsGroup, tc.text)
			if tc.wantReply != "" {
				h.api.WaitMessage(t, opsGroup.ID, tc.wantReply)
			}
			h.sync(t)
			got := h.api.SentTo(opsGroup.ID)
			if tc.wantReply == "" && len(got) != 0 {
				t.Errorf("group got %q, want nothing", got)
			}
			if len(got) > 1 {
				t.Errorf("group got %d messages", len(got))
			}
			if n := len(h.api.SentTo(operator.ID)); n != 0 {
				t.Errorf("operator got %d private messages for a group message", n)
			}
			if !tc.allowlisted {
				if ps, _ := h.store.List(); indexUser(ps, operator.ID) >= 0 {
					t.Error("a group message created a pairing code")
				}
			}
		})
	}
}

func indexUser(ps []pairing.Pending, id int64) int {
	for i, p := range ps {
		if p.UserID == id {
			return i
		}
	}
	return -1
}

func TestCorruptAllowlistFailsClosed(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	h.allow(t, syncUser)
	good, err := os.ReadFile(h.store.AllowlistPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.store.AllowlistPath(), []byte(`{"version":1,"users":[{"user_id":111,`), 0o600); err != nil {
		t.Fatal(err)
	}
	h.api.Push(operator, telegramtest.Private(operator), "/gpu status")
	h.api.Push(stranger(3), telegramtest.Private(stranger(3)), "hi")
	h.waitLog(t, "fail closed", 2)
	// Restore, then sync: nothing more comes of the messages above.
	if err := os.WriteFile(h.store.AllowlistPath(), good, 0o600); err != nil {
		t.Fatal(err)
	}
	h.sync(t)
	if got := h.api.SentTo(operator.ID); len(got) != 0 {
		t.Errorf("with a corrupt allowlist the operator got %q", got)
	}
	if got := h.api.SentTo(stranger(3).ID); len(got) != 0 {
		t.Errorf("with a corrupt allowlist a stranger got %q", got)
	}
	logs := h.logs.String()
	for _, want := range []string{"fail closed", h.store.AllowlistPath(), "corrupt file"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

func TestDoctorTurningRedIsNotifiedOnce(t *testing.T) {
	var runs atomic.Int64
	h := startBot(t, harnessOpts{
		// Without the fixture's failing profile the idle box is not red.
		hook:        func(c *config.Config) { delete(c.Profiles, "coder-greedy") },
		doctorEvery: 50 * time.Millisecond,
		doctor: func(f *appliancetest.Fixture) api.DoctorFunc {
			return func(ctx context.Context, p string) api.DoctorReport {
				rep := f.Doctor(ctx, p)
				runs.Add(1)
				return rep
			}
		},
	})
	h.allow(t, operator)
	if rep := h.f.Doctor(context.Background(), ""); rep.Exit >= 1 {
		t.Fatalf("idle fixture is red already: %s", formatDoctor(rep))
	}
	waitRuns := func(n int64) {
		t.Helper()
		target := runs.Load() + n
		if !testkit.Poll(30*time.Second, func() bool { return runs.Load() >= target }) {
			t.Fatalf("doctor ran %d times, waiting for %d", runs.Load(), target)
		}
	}
	waitRuns(2)
	if got := h.api.SentTo(operator.ID); len(got) != 0 {
		t.Fatalf("green doctor notified %q", got)
	}

	// A foreign process holding VRAM is a failing check.
	sleeper := startSleeper(t)
	if err := nvml.WriteClaim(h.f.Cfg.GPU.SimDir, nvml.Claim{PID: sleeper.Pid, MiB: 4096, Name: "foreign"}); err != nil {
		t.Fatal(err)
	}
	red := h.api.WaitMessage(t, operator.ID, "🔴 doctor turned red")
	if !strings.Contains(red, "gpu.foreign_processes") || !strings.Contains(red, "foreign") {
		t.Errorf("red notification:\n%s", red)
	}
	waitRuns(3)
	if n := countContaining(h.api.SentTo(operator.ID), "doctor turned red"); n != 1 {
		t.Errorf("%d red notifications while it stayed red, want 1", n)
	}

	if err := nvml.RemoveClaim(h.f.Cfg.GPU.SimDir, sleeper.Pid); err != nil {
		t.Fatal(err)
	}
	h.api.WaitMessage(t, operator.ID, "🟢 doctor is no longer red")
}

func countContaining(msgs []string, s string) int {
	n := 0
	for _, m := range msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

func TestTokenNeverAppearsInLogsOrErrors(t *testing.T) {
	// The library must not print through the standard logger either.
	var stdlog testkit.SyncBuffer
	log.SetOutput(&stdlog)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	echo := "token " + testToken + " at /bot" + testToken + "/getMe"

	t.Run("refused token at start is retried and reported", func(t *testing.T) {
		h := startBot(t, harnessOpts{before: func(api *telegramtest.Fake) {
			api.FailNext("getMe", 3, telegramtest.Failure{Code: 401, Description: "Unauthorized: " + echo})
		}})
		st := h.waitStatus(t, "backing off on a refused token", func(st api.TelegramStatus) bool {
			return st.State == api.TelegramBackingOff && st.Errors["unauthorized"] >= 1
		})
		assertNoToken(t, "status", fmt.Sprint(st))
		for _, want := range []string{api.TelegramTokenRefused, "telegram.token_file"} {
			if !strings.Contains(st.Reason, want) {
				t.Errorf("reason %q lacks %q", st.Reason, want)
			}
		}
		h.sync(t) // the fourth getMe succeeds: the bot works
		if st := h.bot.Status(); st.State != api.TelegramPolling || st.Errors["unauthorized"] != 3 {
			t.Errorf("after recovery: %+v", st)
		}
	})

	t.Run("transient failures are retried and logged without the token", func(t *testing.T) {
		h := startBot(t, harnessOpts{before: func(api *telegramtest.Fake) {
			api.FailNext("getMe", 2, telegramtest.Failure{Code: 500, Description: "Internal Server Error: " + echo})
			api.FailNext("getUpdates", 2, telegramtest.Failure{Code: 502, Raw: "<html>502 Bad Gateway for /bot" + testToken + "/getUpdates</html>"})
			api.FailNext("sendMessage", 1, telegramtest.Failure{Code: 400, Description: "Bad Request: " + echo})
		}})
		m := stranger(7)
		h.api.Push(m, telegramtest.Private(m), "hi") // its answer fails (400)
		h.api.Push(m, telegramtest.Private(m), "hi?")
		h.api.WaitMessage(t, m.ID, "Your pairing code is still")
		logs := h.logs.String()
		for _, want := range []string{"backing off", "Internal Server Error", "502 Bad Gateway", "send telegram message", "<redacted>"} {
			if !strings.Contains(logs, want) {
				t.Errorf("log lacks %q (so the test did not exercise that path):\n%s", want, logs)
			}
		}
	})

	t.Run("token refused while polling is retried and reported", func(t *testing.T) {
		h := startBot(t, harnessOpts{})
		h.sync(t) // polling works
		h.api.FailNext("getUpdates", 2, telegramtest.Failure{Code: 401, Description: "Unauthorized: " + echo})
		h.api.Push(syncUser, telegramtest.Private(syncUser), "/gpu help") // wakes the long poll
		h.waitStatus(t, "backing off on a refused token", func(st api.TelegramStatus) bool {
			return st.Errors["unauthorized"] >= 1
		})
		h.sync(t) // and it comes back by itself
		select {
		case err := <-h.done:
			h.done <- err
			t.Fatalf("Run returned (%v) on a 401", err)
		default:
		}
		if st := h.bot.Status(); st.State != api.TelegramPolling || st.Errors["unauthorized"] != 2 {
			t.Errorf("after recovery: %+v", st)
		}
		h.waitLog(t, "refuses the bot token", 2)
	})
	assertNoToken(t, "standard log", stdlog.String())
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("GPUHOST_TG_TEST_SET", "  "+testToken+"\n")
	t.Setenv("GPUHOST_TG_TEST_BAD", "not a token")
	cases := []struct {
		name    string
		tc      config.TelegramConfig
		wantErr []string // empty = success
		is      error
	}{
		{"disabled", config.TelegramConfig{TokenEnv: "GPUHOST_TG_TEST_SET"}, []string{"disabled"}, ErrDisabled},
		{"env", config.TelegramConfig{Enabled: true, TokenEnv: "GPUHOST_TG_TEST_SET"}, nil, nil},
		{"env unset", config.TelegramConfig{Enabled: true, TokenEnv: "GPUHOST_TG_TEST_UNSET"}, []string{"GPUHOST_TG_TEST_UNSET", "missing"}, nil},
		{"no source", config.TelegramConfig{Enabled: true}, []string{"telegram.token_env", "telegram.token_file"}, nil},
		{"file wins over env", config.TelegramConfig{Enabled: true, TokenEnv: "GPUHOST_TG_TEST_BAD", TokenFile: write("ok", testToken+"\n")}, nil, nil},
		{"file missing", config.TelegramConfig{Enabled: true, TokenFile: dir + "/nope"}, []string{dir + "/nope", "telegram.token_file"}, os.ErrNotExist},
		{"file empty", config.TelegramConfig{Enabled: true, TokenFile: write("empty", "\n")}, []string{"is empty", dir + "/empty"}, nil},
		{"malformed env", config.TelegramConfig{Enabled: true, TokenEnv: "GPUHOST_TG_TEST_BAD"}, []string{"malformed", "GPUHOST_TG_TEST_BAD"}, nil},
		{"malformed file", config.TelegramConfig{Enabled: true, TokenFile: write("bad", "4242:secret with spaces/..")}, []string{"malformed", dir + "/bad"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.tc, Daemon{StateDir: dir}, idleSupervisor{}, nil, nil)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if b.token != testToken {
					t.Errorf("token read wrongly")
				}
				return
			}
			if err == nil {
				t.Fatal("New succeeded")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			for _, secret := range []string{"secret with spaces", "not a token"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q repeats the token", err)
				}
			}
		})
	}
}

// idleSupervisor is enough for New, which only stores it.
type idleSupervisor struct{}

func (idleSupervisor) State() api.State                  { return api.State{Phase: api.PhaseIdle} }
func (idleSupervisor) Status(context.Context) api.Status { return api.Status{} }
func (idleSupervisor) LastSeq() uint64                   { return 0 }
func (idleSupervisor) Subscribe(uint64) (<-chan api.Event, []api.Event, func()) {
	return make(chan api.Event), nil, func() {}
}

func TestRedactHandlerScrubsEveryKindOfValue(t *testing.T) {
	var buf testkit.SyncBuffer
	b := &Bot{token: testToken}
	l := slog.New(redactlog.New(slog.NewTextHandler(&buf, nil), b.redact))
	l.Info("msg "+testToken, "s", "x"+testToken, "err", errors.New("GET /bot"+testToken+"/getMe"),
		"any", map[string]string{"u": testToken}, slog.Group("group", "k", testToken))
	l.With("with", testToken).WithGroup("g").Warn("w", "escaped", "a%3A"+strings.SplitN(testToken, ":", 2)[1])
	out := buf.String()
	assertNoToken(t, "log", out)
	if strings.Count(out, "<redacted>") < 6 {
		t.Errorf("expected the token replaced everywhere:\n%s", out)
	}
}

func startSleeper(t *testing.T) *os.Process {
	t.Helper()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "300"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill(); _, _ = p.Wait() })
	return p
}
