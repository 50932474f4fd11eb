package telegram

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"gpuhost/agent"
	"gpuhost/config"
	"gpuhost/internal/telegramtest"
)

// scriptedAsker answers every question with the same recovery timeline
// (first call fails, the retry succeeds). With gate set, each question
// waits for a value on it (or for its context) first.
type scriptedAsker struct {
	gate   chan struct{}
	answer string

	mu   sync.Mutex
	asks []string
}

func (s *scriptedAsker) Ask(ctx context.Context, q string, emit func(agent.Event)) agent.Result {
	s.mu.Lock()
	s.asks = append(s.asks, q)
	s.mu.Unlock()
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			e := agent.Event{Seq: 1, Kind: agent.EventStop, Reason: agent.StopCanceled}
			emit(e)
			return agent.Result{Stop: agent.StopCanceled, Events: []agent.Event{e}}
		}
	}
	answer := s.answer
	if answer == "" {
		answer = "6*7 is 42."
	}
	evs := []agent.Event{
		{Kind: agent.EventStart, Text: q, Tools: []string{"calc_evaluate", "gpu_status"}},
		{Kind: agent.EventModel, Step: 1},
		{Kind: agent.EventToolCall, Step: 1, Tool: "calc_evaluate", Arguments: `{"expression":"6*"}`},
		{Kind: agent.EventToolResult, Step: 1, Tool: "calc_evaluate", Result: "cannot evaluate", IsError: true},
		{Kind: agent.EventModel, Step: 2},
		{Kind: agent.EventToolCall, Step: 2, Tool: "calc_evaluate", Arguments: `{"expression":"6*7"}`},
		{Kind: agent.EventToolResult, Step: 2, Tool: "calc_evaluate", Result: "42"},
		{Kind: agent.EventModel, Step: 3},
		{Kind: agent.EventAnswer, Step: 3, Text: answer},
		{Kind: agent.EventStop, Step: 3, Reason: agent.StopAnswer},
	}
	for i := range evs {
		evs[i].Seq = i + 1
		emit(evs[i])
	}
	return agent.Result{Answer: answer, Stop: agent.StopAnswer, Steps: 3, Errors: 1, ToolsUsed: []string{"calc_evaluate"}, Events: evs}
}

func (s *scriptedAsker) questions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.asks...)
}

func TestParseAsk(t *testing.T) {
	for _, tc := range []struct {
		text string
		q    string
		kind askKind
	}{
		{"/ask how warm is the GPU?", "how warm is the GPU?", askQuestion},
		{"  /ask   spaced  out  ", "spaced  out", askQuestion},
		{"/ask\nline one\nline two", "line one\nline two", askQuestion},
		{"/ask@gpuhost_test_bot what runs?", "what runs?", askQuestion},
		{"/ask@GPUHOST_TEST_BOT what runs?", "what runs?", askQuestion},
		{"/ask@otherbot what runs?", "", askOtherBot},
		{"/ask@ what runs?", "", askOtherBot},
		{"/ask", "", askEmpty},
		{"/ask   \n ", "", askEmpty},
		{"/ask@gpuhost_test_bot", "", askEmpty},
		{"/asking things", "", askNone},
		{"/ASK x", "", askNone},
		{"ask x", "", askNone},
		{"/gpu status", "", askNone},
		{"", "", askNone},
		{"/ask \xff", "", askNone},
	} {
		q, kind := parseAsk(tc.text, testBotName)
		if q != tc.q || kind != tc.kind {
			t.Errorf("parseAsk(%q) = %q, %d; want %q, %d", tc.text, q, kind, tc.q, tc.kind)
		}
	}
	if _, kind := parseAsk("/ask@gpuhost_test_bot x", ""); kind != askOtherBot {
		t.Errorf("before getMe an addressed /ask is taken as ours")
	}
}

func FuzzParseAsk(f *testing.F) {
	for _, s := range []string{"/ask hi", "/ask@gpuhost_test_bot  x\ny", "/ask", "/ask@", " \t/ask\u00a0q", "/ask \xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		q, kind := parseAsk(text, testBotName)
		if kind < askNone || kind > askQuestion {
			t.Fatalf("kind %d out of range", kind)
		}
		if (kind == askQuestion) != (q != "") {
			t.Fatalf("parseAsk(%q) = %q, %d", text, q, kind)
		}
		if kind == askQuestion && (q != strings.TrimSpace(q) || !strings.Contains(text, q) || !utf8.ValidString(q)) {
			t.Fatalf("question %q is not a trimmed part of %q", q, text)
		}
		if kind != askNone && !strings.HasPrefix(strings.TrimSpace(text), "/ask") {
			t.Fatalf("%q taken as /ask", text)
		}
	})
}

func TestFormatAskReply(t *testing.T) {
	var evs []agent.Event
	res := (&scriptedAsker{}).Ask(context.Background(), "q", func(e agent.Event) { evs = append(evs, e) })
	got := formatAskReply(res, evs, 2300*time.Millisecond)
	want := "6*7 is 42.\n\n— tools: calc_evaluate ✗, calc_evaluate ✓ · errors: 1 · steps: 3 · 2.3 s · stop: answer"
	if got != want {
		t.Errorf("reply\n got %q\nwant %q", got, want)
	}

	capped := formatAskReply(agent.Result{Stop: agent.StopMaxSteps, Steps: 6}, []agent.Event{
		{Kind: agent.EventToolResult, Step: 6, Tool: "gpu_status"},
		{Kind: agent.EventStop, Step: 6, Reason: agent.StopMaxSteps, Text: "6 steps without an answer"},
	}, time.Second)
	if !strings.HasPrefix(capped, "No answer: the step cap was reached: 6 steps without an answer\n\n— tools: gpu_status ✓ · errors: 0 · steps: 6") ||
		!strings.HasSuffix(capped, "stop: max_steps") {
		t.Errorf("capped reply %q", capped)
	}

	busy := formatAskReply(agent.Result{Stop: agent.StopBusy}, []agent.Event{{Kind: agent.EventStop, Reason: agent.StopBusy, Text: "2 questions are already being answered"}}, 0)
	if busy != "The box is busy: 2 questions are already being answered" {
		t.Errorf("busy reply %q", busy)
	}

	// A huge answer is clipped; the trace survives whole, within the limit.
	for _, filler := range []string{"a", "é", "😀"} {
		huge := strings.Repeat(filler, 5000)
		var many []agent.Event
		for i := range 40 {
			many = append(many, agent.Event{Kind: agent.EventToolResult, Step: i + 1, Tool: "tool_" + strings.Repeat("x", 100), IsError: i%2 == 0})
		}
		many = append(many, agent.Event{Kind: agent.EventStop, Reason: agent.StopAnswer})
		r := formatAskReply(agent.Result{Answer: huge, Stop: agent.StopAnswer}, many, time.Minute)
		if n := utf16Len(r); n > maxMessageUnits || !utf8.ValidString(r) {
			t.Errorf("%s: %d UTF-16 units (limit %d)", filler, n, maxMessageUnits)
		}
		if !strings.Contains(r, "…\n\n— tools: ") || !strings.Contains(r, "(+28 more) · errors: 20 · steps: 40") {
			t.Errorf("%s: clipped reply lost its trace: …%q", filler, r[len(r)-300:])
		}
	}
}

// askHarness is a bot with /ask on the scripted asker, the operator
// allowlisted, and a 10 s rate limit judged on the test clock.
func askHarness(t *testing.T, a Asker) *harness {
	t.Helper()
	h := startBot(t, harnessOpts{asker: a, hook: func(c *config.Config) {
		c.Agent.TelegramEvery = config.Duration(10 * time.Second)
	}})
	h.allow(t, operator)
	return h
}

// TestAskCommand: an allowlisted sender gets "working…" and then the
// answer with the trace; a bare /ask gets the usage; a stranger gets only
// the pairing flow and the loop never runs.
func TestAskCommand(t *testing.T) {
	a := &scriptedAsker{}
	h := askHarness(t, a)

	h.api.Push(operator, telegramtest.Private(operator), "/ask what is 6*7?")
	reply := h.api.WaitMessage(t, operator.ID, "6*7 is 42.")
	msgs := h.api.SentTo(operator.ID)
	if len(msgs) != 2 || msgs[0] != askWorking {
		t.Fatalf("messages to the operator: %q, want working… then the answer", msgs)
	}
	for _, w := range []string{"calc_evaluate ✗", "calc_evaluate ✓", "errors: 1", "stop: answer"} {
		if !strings.Contains(reply, w) {
			t.Errorf("reply lacks %q:\n%s", w, reply)
		}
	}
	if q := a.questions(); len(q) != 1 || q[0] != "what is 6*7?" {
		t.Errorf("asked %q", q)
	}

	h.api.Push(operator, telegramtest.Private(operator), "/ask")
	h.api.WaitMessage(t, operator.ID, "Usage: /ask <question>")

	m := stranger(1)
	h.api.Push(m, telegramtest.Private(m), "/ask what is the storage status?")
	text := h.api.WaitMessage(t, m.ID, "gpuhost pair approve")
	assertOnlyPairing(t, "the stranger", []string{text})
	h.sync(t)
	if n := len(a.questions()); n != 1 {
		t.Errorf("the loop ran %d times; a stranger's /ask must not run it", n)
	}

	// In a group, /ask for another bot is not ours.
	h.api.Push(operator, telegramtest.Private(operator), "/ask@otherbot what runs?")
	h.sync(t)
	if n := len(a.questions()); n != 1 {
		t.Errorf("/ask@otherbot ran the loop")
	}
}

// TestAskOnePerChatAndRateLimit: a second question while the first runs
// is refused, as is one within telegram_every of the last; after it, the
// chat may ask again. Another chat is not held up.
func TestAskOnePerChatAndRateLimit(t *testing.T) {
	a := &scriptedAsker{gate: make(chan struct{}, 4)}
	h := askHarness(t, a)

	h.api.Push(operator, telegramtest.Private(operator), "/ask first")
	h.api.WaitMessage(t, operator.ID, askWorking)
	h.api.Push(operator, telegramtest.Private(operator), "/ask second")
	h.api.WaitMessage(t, operator.ID, "still working on your previous question")

	colleague := stranger(7)
	h.allow(t, colleague)
	h.api.Push(colleague, telegramtest.Private(colleague), "/ask in parallel")
	h.api.WaitMessage(t, colleague.ID, askWorking)

	a.gate <- struct{}{}
	a.gate <- struct{}{}
	h.api.WaitMessage(t, operator.ID, "6*7 is 42.")
	h.api.WaitMessage(t, colleague.ID, "6*7 is 42.")

	h.api.Push(operator, telegramtest.Private(operator), "/ask too soon")
	wait := h.api.WaitMessage(t, operator.ID, "Please wait")
	if !strings.HasSuffix(wait, " s before the next /ask.") {
		t.Errorf("wait reply %q", wait)
	}
	h.clock.Add(11 * time.Second)
	a.gate <- struct{}{}
	h.api.Push(operator, telegramtest.Private(operator), "/ask later")
	h.api.WaitFor(t, "the second answer", func(sent []telegramtest.Sent) bool {
		n := 0
		for _, m := range sent {
			if m.ChatID == operator.ID && strings.HasPrefix(m.Text, "6*7 is 42.") {
				n++
			}
		}
		return n == 2
	})
	want := []string{"first", "in parallel", "later"}
	got := a.questions()
	if len(got) != 3 || got[0] != want[0] || got[2] != want[2] {
		t.Errorf("asked %q, want %q (refused questions must not run)", got, want)
	}
}

// TestAskDisabled: without an agent (no SetAsker, or the nil
// *agent.Limiter a daemon that built none holds), /ask says it is off.
func TestAskDisabled(t *testing.T) {
	for name, a := range map[string]Asker{"no SetAsker": nil, "nil limiter": (*agent.Limiter)(nil)} {
		t.Run(name, func(t *testing.T) {
			h := startBot(t, harnessOpts{asker: a})
			h.allow(t, operator)
			h.api.Push(operator, telegramtest.Private(operator), "/ask anything")
			h.api.WaitMessage(t, operator.ID, "The agent is not enabled")
		})
	}
}
