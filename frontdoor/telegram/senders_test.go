package telegram

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-telegram/bot/models"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/internal/pairing"
	"gpuhost/internal/telegramtest"
	"gpuhost/units"
)

// TestInvalidSenderIDsLoggedOncePerWindow: messages from sender ids ≤ 0
// (real Telegram sends none; a fuzzer or a broken proxy may) are ignored,
// logged at warn once per window and at debug otherwise, never as an error.
func TestInvalidSenderIDsLoggedOncePerWindow(t *testing.T) {
	h := startBot(t, harnessOpts{})
	const n = 40
	for i := range n {
		u := models.User{ID: -int64(i % 3), FirstName: "Bad"}
		h.api.Push(u, telegramtest.Private(u), "/start")
	}
	// Updates are handled in order: a stranger's code after them means
	// every invalid one was seen.
	m := stranger(1)
	h.api.Push(m, telegramtest.Private(m), "/start")
	h.api.WaitMessage(t, m.ID, "gpuhost pair approve")
	count := func(sub string) int {
		c := 0
		for _, l := range strings.Split(h.logs.String(), "\n") {
			if strings.Contains(l, sub) && strings.Contains(l, "invalid sender") {
				c++
			}
		}
		return c
	}
	if got := strings.Count(h.logs.String(), "level=ERROR"); got != 0 {
		t.Errorf("%d ERROR lines for invalid senders, want 0", got)
	}
	if got := count("level=WARN"); got != 1 {
		t.Errorf("%d warn lines for %d invalid senders in one window, want 1", got, n)
	}
	if got := count("level=DEBUG"); got != n-1 {
		t.Errorf("%d debug lines, want %d", got, n-1)
	}
	// The next window logs one warn line again, saying how many were quiet.
	h.clock.Add(invalidLogEvery)
	u := models.User{ID: -7}
	h.api.Push(u, telegramtest.Private(u), "/start")
	m2 := stranger(2)
	h.api.Push(m2, telegramtest.Private(m2), "/start")
	h.api.WaitMessage(t, m2.ID, "gpuhost pair approve")
	if got := count("level=WARN"); got != 2 {
		t.Errorf("%d warn lines after the window passed, want 2", got)
	}
	if !strings.Contains(h.logs.String(), "ignored_quietly_before=39") {
		t.Error("the second window's warn line does not say how many were ignored quietly")
	}
	if len(h.api.SentTo(0))+len(h.api.SentTo(-1))+len(h.api.SentTo(-2)) != 0 {
		t.Error("the bot answered an invalid sender")
	}
}

// TestHangingBotAPIShows: a Bot API that accepts getUpdates and never
// answers shows as backing off, naming the hang, in the bot's status,
// /api/status (the Supervisor's status) and the doctor while the API still
// hangs (after the long poll plus the margin; the hang here lasts until
// the test ends it, so the order proves the bound), and a command sent
// during the hang is answered once it ends.
func TestHangingBotAPIShows(t *testing.T) {
	h := startBot(t, harnessOpts{hangMargin: time.Second})
	h.f.Sup.SetTelegramStatus(h.bot.Status)
	h.pairUser(t, operator)
	ctx := context.Background()
	end := h.api.Hang()
	defer end()
	hungAt := time.Now()
	var st api.TelegramStatus
	for st = h.bot.Status(); st.State == api.TelegramPolling; st = h.bot.Status() {
		if time.Since(hungAt) > time.Minute {
			t.Fatalf("still %q a minute into the hang", st.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(hungAt)
	if st.State != api.TelegramBackingOff || !strings.Contains(st.Reason, "the Bot API hangs") {
		t.Fatalf("status during the hang: %q %q", st.State, st.Reason)
	}
	if tg := h.f.Sup.Status(ctx).Telegram; tg == nil || tg.State != api.TelegramBackingOff {
		t.Errorf("/api/status telegram = %+v, want backing_off", tg)
	}
	found := false
	doctor := &appliance.Doctor{Cfg: h.f.Cfg, GPU: h.f.GPU, Units: h.f.Units, Telegram: h.f.Sup.TelegramStatus}
	for _, c := range doctor.Run(ctx).Checks {
		if c.ID == "telegram.bot" {
			found = true
			if c.Severity == units.SeverityOK || !strings.Contains(c.Message, "the Bot API hangs") {
				t.Errorf("doctor telegram.bot = %s %q, want a finding naming the hang", c.Severity, c.Message)
			}
		}
	}
	if !found {
		t.Error("the doctor has no telegram.bot check")
	}
	t.Logf("hang shown after %s (long poll %s + margin %s)", took.Round(time.Millisecond), h.bot.pollTimeout, h.bot.hangMargin)
	// The hang began when the unanswered call left, not when its deadline
	// passed: the state's since is at least the long poll and margin ago.
	if held := h.bot.now().Sub(st.Since); held < h.bot.pollTimeout+h.bot.hangMargin {
		t.Errorf("backing_off since %s ago at the moment the hang showed, want at least %s", held, h.bot.pollTimeout+h.bot.hangMargin)
	}
	// A command sent during the hang is answered once it ends.
	h.api.Push(operator, telegramtest.Private(operator), "/gpu status")
	end()
	h.api.WaitMessage(t, operator.ID, "last switch")
	for st := h.bot.Status(); st.State != api.TelegramPolling; st = h.bot.Status() {
		if time.Since(hungAt) > 2*time.Minute {
			t.Fatalf("after the hang: %q", st.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPairingUnderAFlood: with the code rate used up by strangers, the
// operator pairs a known user with `gpuhost pair add` while the bot runs
// (answered from the next message, no code), and a person refused a code
// is first in line: the code the rate frees next goes to them, sent
// unasked when the next stranger writes, not to that stranger.
func TestPairingUnderAFlood(t *testing.T) {
	h := startBot(t, harnessOpts{})
	for i := range pairing.NewCodesPerMinute {
		u := stranger(i)
		h.api.Push(u, telegramtest.Private(u), "/start")
	}
	h.api.WaitFor(t, "a code for every stranger in the rate", func(sent []telegramtest.Sent) bool { return len(sent) == pairing.NewCodesPerMinute })
	person, late, next := stranger(100), stranger(101), stranger(102)
	h.api.Push(person, telegramtest.Private(person), "/start")
	h.api.Push(late, telegramtest.Private(late), "/start")
	out, err := runPair(t, h.f.Cfg.StateDir, "add", strconv.FormatInt(operator.ID, 10), "--name", "Olga")
	if err != nil || !strings.Contains(out, "added user 111") {
		t.Fatalf("pair add = %q, %v", out, err)
	}
	if _, err := runPair(t, h.f.Cfg.StateDir, "add", "--", "-5"); err == nil || !strings.Contains(err.Error(), "not a Telegram user id") {
		t.Errorf("pair add -- -5 = %v, want a clear refusal", err)
	}
	h.api.Push(operator, telegramtest.Private(operator), "/gpu status")
	h.api.WaitMessage(t, operator.ID, "last switch") // updates are handled in order
	if got := h.api.SentTo(person.ID); len(got) != 0 {
		t.Fatalf("the person got %q while the rate was used up", got)
	}
	h.clock.Add(time.Minute + time.Second)
	h.api.Push(next, telegramtest.Private(next), "/start")
	text := h.api.WaitMessage(t, person.ID, "gpuhost pair approve")
	code := codeIn(text)
	if code == "" {
		t.Fatalf("the person got %q, want a pairing code", text)
	}
	if got := h.api.SentTo(next.ID); len(got) != 0 {
		t.Errorf("the stranger who wrote when the code was freed got %q; it was the person's turn", got)
	}
	if out, err := runPair(t, h.f.Cfg.StateDir, "approve", code); err != nil {
		t.Errorf("approve the person's code = %q, %v", out, err)
	}
	if ok, _ := h.store.Allowed(person.ID); !ok {
		t.Error("the person is not allowlisted after the approval")
	}
}

// TestPairingLineMovesOnItsOwn: a person refused a code during a flood gets
// the next freed code unasked, although nobody writes to the bot after
// them (the line moves on the bot's clock, not on the next stranger's
// message).
func TestPairingLineMovesOnItsOwn(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.sync(t) // the sync user is paired before the flood uses up the rate
	for i := range pairing.NewCodesPerMinute {
		u := stranger(i)
		h.api.Push(u, telegramtest.Private(u), "/start")
	}
	h.api.WaitFor(t, "a code for every stranger in the rate", func(sent []telegramtest.Sent) bool { return len(sent) == pairing.NewCodesPerMinute })
	person := stranger(100)
	h.api.Push(person, telegramtest.Private(person), "/start")
	h.sync(t) // the person's /start is handled
	if got := h.api.SentTo(person.ID); len(got) != 0 {
		t.Fatalf("the person got %q while the rate was used up", got)
	}
	h.clock.Add(time.Minute + time.Second)
	if code := codeIn(h.api.WaitMessage(t, person.ID, "gpuhost pair approve")); code == "" {
		t.Fatal("the person's unasked message carries no pairing code")
	}
}

// TestPollingOnceConnected: the state is polling as soon as getMe answers,
// not only when the first long poll returns (up to its timeout later): the
// state's since is then before the first poll's return.
func TestPollingOnceConnected(t *testing.T) {
	h := startBot(t, harnessOpts{})
	st := h.waitStatus(t, "polled once", func(st api.TelegramStatus) bool { return !st.LastPoll.IsZero() })
	if st.State != api.TelegramPolling || !st.Since.Before(st.LastPoll) {
		t.Errorf("state %q since %s, first poll %s: want polling from the connect, before the first poll returned",
			st.State, st.Since.Format(time.StampMilli), st.LastPoll.Format(time.StampMilli))
	}
}
