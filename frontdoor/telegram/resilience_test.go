package telegram

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-telegram/bot/models"

	"gpuhost/api"
	"gpuhost/internal/pairing"
	"gpuhost/internal/telegramtest"
	"gpuhost/internal/testkit"
)

// Availability: whatever arrives from Telegram, the bot keeps answering,
// and when it cannot, it says so in Status.

// A private message forwarded from a kind of origin newer than the library
// cannot be decoded. Any stranger can send one; it must cost one skipped
// update, not the bot (before, every batch failed and the offset never
// advanced).
func TestUndecodableUpdateIsSkipped(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	m := stranger(3)
	poison := h.api.PushRaw(fmt.Sprintf(`{"message":{"message_id":1,"date":1700000000,
		"from":{"id":%d,"is_bot":false,"first_name":"Mallory"},
		"chat":{"id":%d,"type":"private","first_name":"Mallory"},
		"forward_origin":{"type":"hologram","date":1700000000},
		"text":"look at this"}}`, m.ID, m.ID))
	h.api.Push(operator, telegramtest.Private(operator), "/gpu status")
	got := h.api.WaitMessage(t, operator.ID, "")
	if codeIn(got) != "" {
		t.Fatalf("the operator got a pairing code: %q", got)
	}
	if st := h.bot.Status(); st.UpdatesSkipped != 1 || st.State != api.TelegramPolling {
		t.Errorf("status after a poison update: %+v", st)
	}
	// The next poll confirms past the poison update: Telegram forgets it.
	if !testkit.Poll(30*time.Second, func() bool { return h.api.Confirmed() > poison }) {
		t.Fatalf("confirmed offset %d is not past the poison update %d", h.api.Confirmed(), poison)
	}
	h.waitLog(t, "skipping a Telegram update that cannot be decoded", 1)
	logs := h.logs.String()
	for _, want := range []string{fmt.Sprintf("update_id=%d", poison), "kind=message", "unsupported MessageOrigin"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if n := strings.Count(logs, "cannot be decoded"); n != 1 {
		t.Errorf("%d WARN lines for one poison update", n)
	}
	if got := h.api.SentTo(m.ID); len(got) != 0 {
		t.Errorf("the poison's sender got %q", got)
	}
}

// Many poison updates in one batch, mixed with good ones: the good ones
// are all handled, in order.
func TestPoisonBatch(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	for i := range 5 {
		h.api.PushRaw(`{"message":{"message_id":1,"date":1,"chat":{"id":1,"type":"private"},"forward_origin":{"type":"x"}}}`)
		h.api.PushRaw(`{"some_future_update":{"id":1}, "message": 7}`)
		h.api.Push(operator, telegramtest.Private(operator), fmt.Sprintf("/gpu help %d", i))
	}
	h.api.WaitFor(t, "5 help replies", func(sent []telegramtest.Sent) bool { return len(sent) >= 5 })
	if st := h.bot.Status(); st.UpdatesSkipped != 10 {
		t.Errorf("skipped %d updates, want 10", st.UpdatesSkipped)
	}
}

// A stolen, rotated token: 401 until the operator puts the new one in the
// token file; the bot picks it up by itself and the new token stays out of
// logs and status as well.
func TestRotatedTokenIsPickedUp(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	h.sync(t)
	const newToken = "4242424242:AANewRotatedSecretValue_zyxwvutsrqpo"
	h.api.SetToken(newToken)
	h.api.Push(operator, telegramtest.Private(operator), "/gpu help")
	st := h.waitStatus(t, "backing off on the rotated token", func(st api.TelegramStatus) bool {
		return st.State == api.TelegramBackingOff && strings.HasPrefix(st.Reason, api.TelegramTokenRefused)
	})
	if err := os.WriteFile(h.f.Cfg.Telegram.TokenFile, []byte(newToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.api.WaitMessage(t, operator.ID, "/gpu status")
	h.sync(t)
	if st := h.bot.Status(); st.State != api.TelegramPolling {
		t.Errorf("after the rotation: %+v", st)
	}
	h.waitLog(t, "token changed", 1)
	_, secret, _ := strings.Cut(newToken, ":")
	for what, s := range map[string]string{"log": h.logs.String(), "status": fmt.Sprint(st, h.bot.Status())} {
		if strings.Contains(s, secret) {
			t.Errorf("the new token appears in the %s", what)
		}
	}
}

// A 429 on getUpdates is honoured: the next poll waits retry_after (a lower
// bound on wall time, so a slow machine cannot fail it).
func TestRetryAfterOnGetUpdatesIsHonoured(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.sync(t)
	h.api.FailNext("getUpdates", 1, telegramtest.Failure{Code: 429, Description: "Too Many Requests: retry after 2", RetryAfter: 2})
	h.api.Push(syncUser, telegramtest.Private(syncUser), "/gpu help") // wakes the long poll
	h.waitStatus(t, "rate limited", func(st api.TelegramStatus) bool { return st.Errors["rate_limited"] == 1 })
	h.sync(t)
	// After the 429'd call the next must wait ≥ 2 s; every other poll
	// follows at once or returns early when an update is pushed.
	calls := h.api.CallTimes("getUpdates")
	maxGap := time.Duration(0)
	for i := 1; i < len(calls); i++ {
		maxGap = max(maxGap, calls[i].Sub(calls[i-1]))
	}
	if maxGap < 2*time.Second {
		t.Errorf("no pause of retry_after (2 s) between polls; the longest was %s", maxGap)
	}
	if !strings.Contains(h.logs.String(), "retry_in=2s") {
		t.Errorf("log does not show the 2 s wait:\n%s", h.logs.String())
	}
}

// A reply that meets a 429 is sent once more after retry_after; a reply
// that meets a 400 is not retried.
func TestReplyIsRetriedOnce(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	h.api.FailNext("sendMessage", 1, telegramtest.Failure{Code: 429, Description: "Too Many Requests: retry after 1", RetryAfter: 1})
	h.api.Push(operator, telegramtest.Private(operator), "/gpu help")
	h.api.WaitMessage(t, operator.ID, "/gpu status")
	if n := h.api.Calls("sendMessage"); n != 2 {
		t.Errorf("%d sendMessage calls, want 2 (the 429, then the retry)", n)
	}
	h.api.FailNext("sendMessage", 2, telegramtest.Failure{Code: 500, Description: "Internal Server Error"})
	h.api.Push(operator, telegramtest.Private(operator), "/gpu help")
	h.sync(t)
	if got := countContaining(h.api.SentTo(operator.ID), "/gpu status"); got != 1 {
		t.Errorf("operator got %d help texts, want 1 (the second reply failed twice: given up after one retry)", got)
	}
	// A flood wait longer than maxReplyWait: the reply is given up at once
	// rather than holding up the poll loop.
	before := h.api.Calls("sendMessage")
	h.api.FailNext("sendMessage", 1, telegramtest.Failure{Code: 429, Description: "Too Many Requests: retry after 120", RetryAfter: 120})
	h.api.Push(operator, telegramtest.Private(operator), "/gpu help")
	h.sync(t)
	if n := h.api.Calls("sendMessage") - before; n != 2 { // the 429'd reply and the sync reply
		t.Errorf("%d sendMessage calls, want 2 (no retry after a 120 s flood wait)", n)
	}
	if st := h.bot.Status(); st.Errors["rate_limited"] != 2 || st.Errors["server"] != 2 {
		t.Errorf("error counters: %v", st.Errors)
	}
}

// A notification that meets errors is retried with backoff until it goes
// through (bounded attempts).
func TestNotificationIsRetried(t *testing.T) {
	h := startBot(t, harnessOpts{activate: "coder"})
	h.allow(t, operator)
	h.sync(t)
	h.api.FailNext("sendMessage", 2, telegramtest.Failure{Code: 429, Description: "Too Many Requests: retry after 1", RetryAfter: 1})
	h.api.FailNext("sendMessage", 2, telegramtest.Failure{Code: 502, Raw: "<html>Bad Gateway</html>"})
	if _, err := h.f.SwitchTo(t, "llama"); err != nil {
		t.Fatalf("switch: %v", err)
	}
	h.api.WaitMessage(t, operator.ID, "✅ switch done: llama")
	if st := h.bot.Status(); st.NotificationsDropped != 0 {
		t.Errorf("status: %+v", st)
	}
}

// Invalid bodies (a proxy's error page, 2 MB of it) are logged capped.
func TestInvalidBodiesAreLoggedCapped(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	h.sync(t)
	big := strings.Repeat("<html>gateway error page ", 2<<20/25)
	h.api.FailNext("getUpdates", 2, telegramtest.Failure{Code: 502, Raw: big})
	h.api.FailNext("sendMessage", 2, telegramtest.Failure{Code: 200, Raw: big})
	h.api.Push(operator, telegramtest.Private(operator), "/gpu help")
	h.waitStatus(t, "two bad answers", func(st api.TelegramStatus) bool { return st.Errors["server"] >= 2 })
	h.sync(t)
	logs := h.logs.String()
	if !strings.Contains(logs, "gateway error page") {
		t.Fatalf("log does not show the start of the body:\n%.2000s", logs)
	}
	if len(logs) > 64<<10 {
		t.Errorf("log is %d bytes after 4 bad answers of %d bytes, want the bodies capped", len(logs), len(big))
	}
	if st := h.bot.Status(); st.Errors["invalid_response"] != 2 {
		t.Errorf("error counters: %v", st.Errors)
	}
}

// While 100 live codes fill the cap, a new stranger still gets a code: the
// oldest live one is evicted.
func TestNewcomerGetsACodeWhenTheCapIsFull(t *testing.T) {
	h := startBot(t, harnessOpts{})
	now := time.Now()
	for i := range pairing.MaxLivePending {
		at := now.Add(-9*time.Minute + time.Duration(i)*3*time.Second) // 20 a minute, all live
		h.store.Now = func() time.Time { return at }
		if _, err := h.store.Request(pairing.Sender{UserID: int64(70000 + i), ChatID: int64(70000 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	h.store.Now = h.clock.Now
	newcomer := models.User{ID: 8888, FirstName: "Nina", Username: "newcomer"}
	h.api.Push(newcomer, telegramtest.Private(newcomer), "hello")
	code := codeIn(h.api.WaitMessage(t, newcomer.ID, "gpuhost pair approve"))
	if code == "" {
		t.Fatal("no code for the newcomer")
	}
	if out, err := runPair(t, h.f.Cfg.StateDir, "approve", code); err != nil {
		t.Fatalf("approve: %v\n%s", err, out)
	}
	if _, err := h.store.Approve(mustCodeOf(t, h.store, 70000)); err == nil {
		t.Error("the oldest code was not evicted")
	}
}

func mustCodeOf(t *testing.T, s *pairing.Store, user int64) string {
	t.Helper()
	ps, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if i := indexUser(ps, user); i >= 0 {
		return ps[i].Code
	}
	t.Fatalf("no code of user %d", user)
	return ""
}

// Run's end is a stopped bot with the reason; New's failure gives a
// stopped status too.
func TestStoppedStatus(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.sync(t)
	if st := h.bot.Status(); st.State != api.TelegramPolling || st.Bot != testBotName || st.LastPoll.IsZero() {
		t.Errorf("polling status: %+v", st)
	}
	h.stop()
	err := <-h.done
	h.done <- err
	if st := h.bot.Status(); st.State != api.TelegramStopped || st.Reason == "" {
		t.Errorf("after Run: %+v", st)
	}
	st := StoppedStatus(fmt.Errorf("telegram bot token missing: set GPUHOST_TELEGRAM_TOKEN"), time.Now())()
	if st.State != api.TelegramStopped || !strings.Contains(st.Reason, "token missing") || len(st.Errors) != len(ErrorKinds) {
		t.Errorf("StoppedStatus: %+v", st)
	}
}

// An answer holding more values than jsonlimit.Default (a Bot API, or
// whatever answers in its place, sending 60,000 empty updates) is refused
// before it is decoded, counted as an invalid answer, and the bot goes on.
func TestHostileAnswerRefusedBeforeDecoding(t *testing.T) {
	h := startBot(t, harnessOpts{})
	h.allow(t, operator)
	h.sync(t)
	hostile := `{"ok":true,"result":[` + strings.Repeat("{},", 60_000) + `{}]}`
	h.api.FailNext("getUpdates", 1, telegramtest.Failure{Code: 200, Raw: hostile})
	h.waitStatus(t, "the hostile answer counted", func(st api.TelegramStatus) bool { return st.Errors["invalid_response"] >= 1 })
	// The error is counted before it is logged: wait for the line.
	if !testkit.Poll(10*time.Second, func() bool { return strings.Contains(h.logs.String(), "refused before decoding") }) {
		t.Errorf("log does not say the answer was refused before decoding:\n%.2000s", h.logs.String())
	}
	h.api.Push(operator, telegramtest.Private(operator), "/gpu help")
	h.api.WaitMessage(t, operator.ID, "/gpu")
}
