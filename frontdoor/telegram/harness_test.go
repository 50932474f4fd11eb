package telegram

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-telegram/bot/models"
	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/internal/pairing"
	"gpuhost/internal/telegramtest"
	"gpuhost/internal/testkit"
)

// The bot's token and username are the fake Bot API's.
const (
	testToken   = telegramtest.DefaultToken
	testBotName = telegramtest.BotUsername
)

// testClock is real time shifted by a settable offset, so that codes the
// bot issues can be judged by `gpuhost pair` (real clock) as well.
type testClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

type harnessOpts struct {
	activate    string
	allowGroups bool
	hook        func(*config.Config)
	// doctorEvery > 0 runs the periodic doctor at this interval.
	doctorEvery time.Duration
	doctor      func(f *appliancetest.Fixture) api.DoctorFunc
	clockOffset time.Duration
	// before runs after the fake API exists and before the bot starts.
	before func(fake *telegramtest.Fake)
	// asker, when set, enables /ask.
	asker Asker
	// hangMargin > 0 replaces the margin after which an unanswered long
	// poll counts as a hanging Bot API.
	hangMargin time.Duration
}

type harness struct {
	api   *telegramtest.Fake
	f     *appliancetest.Fixture
	bot   *Bot
	store *pairing.Store
	clock *testClock
	logs  *testkit.SyncBuffer
	done  chan error
	stop  context.CancelFunc
}

// testDaemon is the Daemon that internal/assemble builds from cfg.
func testDaemon(cfg *config.Config) Daemon {
	return Daemon{StateDir: cfg.StateDir, Profiles: cfg.Profiles, AskEvery: cfg.Agent.TelegramEvery.D()}
}

// startBot runs a real Supervisor (appliancetest) and the bot against a
// fresh fake Bot API, with logs captured and checked for the token at the end.
func startBot(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	fakeBot := telegramtest.New(t)
	fakeBot.RequireKnownChats() // as Telegram: no sendMessage to a chat that never wrote
	tokenFile := filepath.Join(t.TempDir(), "telegram.token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := appliancetest.New(t, appliancetest.Options{Activate: o.activate, Hook: func(c *config.Config) {
		c.Telegram.Enabled = true
		c.Telegram.APIURL = fakeBot.URL()
		c.Telegram.TokenFile = tokenFile
		c.Telegram.AllowGroups = o.allowGroups
		if o.hook != nil {
			o.hook(c)
		}
	}})
	logs := &testkit.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	doctor := f.Doctor
	if o.doctor != nil {
		doctor = o.doctor(f)
	}
	b, err := New(f.Cfg.Telegram, testDaemon(f.Cfg), f.Sup, doctor, log)
	if err != nil {
		t.Fatal(err)
	}
	clock := &testClock{offset: o.clockOffset}
	b.now = clock.Now
	b.pollTimeout = 2 * time.Second
	if o.hangMargin > 0 {
		b.hangMargin = o.hangMargin
	}
	b.retryMin, b.retryMax = 10*time.Millisecond, 50*time.Millisecond
	b.doctorFirst, b.doctorEvery = time.Hour, time.Hour
	if o.doctorEvery > 0 {
		b.doctorFirst, b.doctorEvery = o.doctorEvery, o.doctorEvery
	}
	if o.before != nil {
		o.before(fakeBot)
	}
	if o.asker != nil {
		b.SetAsker(o.asker)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{api: fakeBot, f: f, bot: b, store: pairing.New(f.Cfg.StateDir), clock: clock, logs: logs, done: make(chan error, 1), stop: cancel}
	h.store.Now = clock.Now
	go func() { h.done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15 s of cancel")
		}
		assertNoToken(t, "log", logs.String())
		if t.Failed() {
			t.Logf("bot log:\n%s", logs.String())
		}
	})
	return h
}

func assertNoToken(t *testing.T, what, s string) {
	t.Helper()
	_, secret, _ := strings.Cut(testToken, ":")
	for _, sec := range []string{testToken, secret} {
		if strings.Contains(s, sec) {
			t.Errorf("the bot token appears in the %s:\n%s", what, s)
			return
		}
	}
}

// Test users and chats.
var (
	operator = models.User{ID: 111, FirstName: "Olga", Username: "operator"}
	opsGroup = models.Chat{ID: -1001234, Type: models.ChatTypeSupergroup, Title: "ops"}
)

func stranger(i int) models.User {
	return models.User{ID: int64(5000 + i), FirstName: "Mallory", Username: "mallory" + string(rune('a'+i%26))}
}

var (
	codeClass  = "[" + pairing.CodeAlphabet + "]{8}"
	pairingRE  = regexp.MustCompile(`^This bot is private\. To get access, ask the operator of this machine to run:\n\ngpuhost pair approve (` + codeClass + `)\n\nThe code expires in 10 min\.$`)
	reminderRE = regexp.MustCompile(`^Your pairing code is still (` + codeClass + `) \(expires in [0-9.]+ (?:s|ms|min)\)\. Ask the operator of this machine to run:\n\ngpuhost pair approve (` + codeClass + `)$`)
)

// codeIn returns the code of a pairing or reminder message ("" if the
// message is neither, exactly).
func codeIn(text string) string {
	if m := pairingRE.FindStringSubmatch(text); m != nil {
		return m[1]
	}
	if m := reminderRE.FindStringSubmatch(text); m != nil && m[1] == m[2] {
		return m[1]
	}
	return ""
}

// pairUser has u message the bot and approves the code with the cobra
// command, as the operator would.
func (h *harness) pairUser(t *testing.T, u models.User) {
	t.Helper()
	before := len(h.api.SentTo(u.ID))
	h.api.Push(u, telegramtest.Private(u), "hi")
	var code string
	h.api.WaitFor(t, "a pairing code", func(sent []telegramtest.Sent) bool {
		var to []string
		for _, m := range sent {
			if m.ChatID == u.ID {
				to = append(to, m.Text)
			}
		}
		if len(to) > before {
			code = codeIn(to[len(to)-1])
			return true
		}
		return false
	})
	if code == "" {
		t.Fatalf("no pairing code in %q", h.api.SentTo(u.ID))
	}
	out, err := runPair(t, h.f.Cfg.StateDir, "approve", code)
	if err != nil {
		t.Fatalf("pair approve %s: %v\n%s", code, err, out)
	}
}

// allow puts u on the allowlist through the store, without any message.
func (h *harness) allow(t *testing.T, u models.User) {
	t.Helper()
	out, err := h.store.Request(pairing.Sender{UserID: u.ID, ChatID: u.ID, Username: u.Username, FirstName: u.FirstName})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Approve(out.Code); err != nil {
		t.Fatal(err)
	}
	h.api.KnowChat(telegramtest.Private(u))
}

// syncUser only ever sends sync points, so counting its help replies is exact.
var syncUser = models.User{ID: 999999, FirstName: "Sync", Username: "sync"}

// sync sends "/gpu help" from syncUser and waits for the answer: the bot
// handles updates in order, so everything pushed before is handled.
func (h *harness) sync(t *testing.T) {
	t.Helper()
	if ok, _ := h.store.Allowed(syncUser.ID); !ok {
		h.allow(t, syncUser)
	}
	count := func(sent []telegramtest.Sent) int {
		c := 0
		for _, m := range sent {
			if m.ChatID == syncUser.ID && strings.Contains(m.Text, "/gpu help — this text") {
				c++
			}
		}
		return c
	}
	n := count(h.api.Sent())
	h.api.Push(syncUser, telegramtest.Private(syncUser), "/gpu help")
	h.api.WaitFor(t, "the help reply (sync point)", func(sent []telegramtest.Sent) bool { return count(sent) > n })
}

// waitStatus waits until cond holds for the bot's Status.
func (h *harness) waitStatus(t *testing.T, what string, cond func(api.TelegramStatus) bool) api.TelegramStatus {
	t.Helper()
	var st api.TelegramStatus
	if !testkit.Poll(30*time.Second, func() bool { st = h.bot.Status(); return cond(st) }) {
		t.Fatalf("status never %s: %+v", what, st)
	}
	return st
}

// waitLog waits until the log holds n lines containing s.
func (h *harness) waitLog(t *testing.T, s string, n int) {
	t.Helper()
	if !testkit.Poll(30*time.Second, func() bool { return strings.Count(h.logs.String(), s) >= n }) {
		t.Fatalf("log never had %d × %q:\n%s", n, s, h.logs.String())
	}
}

func runPair(t *testing.T, stateDir string, args ...string) (string, error) {
	t.Helper()
	cmd := NewPairCmd(func(*cobra.Command) (string, error) { return stateDir, nil })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage = true
	err := cmd.Execute()
	return out.String(), err
}
