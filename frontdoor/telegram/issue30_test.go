package telegram

import (
	"strings"
	"testing"

	"github.com/go-telegram/bot/models"

	"gpuhost/internal/telegramtest"
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
