package panel

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/agent"
	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
)

// fakeAsker replays a timeline; it stands in for the loop where the page's
// plumbing (routes, CSRF, rendering, limits) is under test. The browser
// test runs the real loop.
type fakeAsker struct {
	events []agent.Event
	hold   chan struct{} // non-nil: wait here (or for ctx) before the events

	mu   sync.Mutex
	asks []string
}

func (f *fakeAsker) Ask(ctx context.Context, q string, emit func(agent.Event)) agent.Result {
	f.mu.Lock()
	f.asks = append(f.asks, q)
	f.mu.Unlock()
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			e := agent.Event{Seq: 1, Kind: agent.EventStop, Reason: agent.StopCanceled}
			emit(e)
			return agent.Result{Stop: agent.StopCanceled, Events: []agent.Event{e}}
		}
	}
	res := agent.Result{}
	for i, e := range f.events {
		e.Seq = i + 1
		if e.Kind == agent.EventStart {
			e.Text = q
		}
		emit(e)
		res.Events = append(res.Events, e)
		if e.Kind == agent.EventStop {
			res.Stop = e.Reason
		}
	}
	return res
}

func (f *fakeAsker) questions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.asks...)
}

const evilText = `<script>alert(1)</script><img src=x onerror=alert(2)>`

// recoveryEvents: the first call fails, the next step retries and
// succeeds, then the answer (with markup in every string field).
func recoveryEvents() []agent.Event {
	return []agent.Event{
		{Kind: agent.EventStart, Tools: []string{"calc_evaluate", "gpu_status"}},
		{Kind: agent.EventModel, Step: 1, PromptTokens: 310, CompletionTokens: 22, LatencyMS: 41, Model: "qwen3-coder"},
		{Kind: agent.EventToolCall, Step: 1, Tool: "calc_evaluate", Arguments: `{"expression":"` + evilText + `"}`},
		{Kind: agent.EventToolResult, Step: 1, Tool: "calc_evaluate", Result: "cannot evaluate " + evilText, IsError: true, LatencyMS: 1.5},
		{Kind: agent.EventModel, Step: 2, PromptTokens: 360, CompletionTokens: 20, LatencyMS: 39},
		{Kind: agent.EventToolCall, Step: 2, Tool: "calc_evaluate", Arguments: `{"expression":"6*7"}`},
		{Kind: agent.EventToolResult, Step: 2, Tool: "calc_evaluate", Result: `{"result":42}`, LatencyMS: 0.8},
		{Kind: agent.EventModel, Step: 3, PromptTokens: 400, CompletionTokens: 12, LatencyMS: 30},
		{Kind: agent.EventAnswer, Step: 3, Text: "It is 42. " + evilText},
		{Kind: agent.EventStop, Step: 3, Reason: agent.StopAnswer},
	}
}

// askEnv is the panel on the daemon's API with a Supervisor that runs
// nothing: the Ask page needs only its state pill.
type askEnv struct {
	p     *Panel
	srv   *httptest.Server
	token string
}

func newAskEnv(t *testing.T, public bool, a Asker) *askEnv {
	t.Helper()
	state := t.TempDir()
	cfg, err := config.Parse("ask-test", []byte(testbin.ConfigYAML("/nonexistent/gpuhost", state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms")))
	if err != nil {
		t.Fatal(err)
	}
	ev := &askEnv{}
	if public {
		ev.token = "ask-panel-token-0123456789"
		tf := filepath.Join(state, "token")
		if err := os.WriteFile(tf, []byte(ev.token), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.Listen, cfg.APITokenFile = "0.0.0.0:0", tf
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sup := appliance.NewSupervisor(cfg, nil, nil, nil, log)
	t.Cleanup(sup.Close)
	api, err := httpapi.New(sup, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	if ev.p, err = New(sup, nil, testDaemon(cfg), log); err != nil {
		t.Fatal(err)
	}
	if a != nil {
		ev.p.SetAsker(a)
	}
	ev.p.Register(api)
	ev.srv = httptest.NewServer(api)
	t.Cleanup(func() { ev.srv.CloseClientConnections(); ev.srv.Close() })
	return ev
}

func (ev *askEnv) client(t *testing.T) *http.Client { return (&env{}).client(t) }

// postStream sends the page script's request: JSON, CSRF header, the
// browser's provenance headers.
func (ev *askEnv) postStream(t *testing.T, c *http.Client, tok, body string, extra map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ev.srv.URL+"/ask/stream", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(ev.srv.URL)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream, application/json")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Origin", "http://"+u.Host)
	if tok != "" {
		req.Header.Set(csrfHeader, tok)
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(data)
}

var csrfMetaRE = regexp.MustCompile(`<meta name="csrf-token" content="([^"]+)">`)

// csrfMeta reads the token the layout gives the page's script.
func csrfMeta(t *testing.T, page string) string {
	t.Helper()
	m := csrfMetaRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no csrf-token meta in page:\n%s", page)
	}
	return m[1]
}

// TestAskRows: the fold the page renders (and ask.js mirrors).
func TestAskRows(t *testing.T) {
	rows := askRows(recoveryEvents())
	type brief struct {
		Kind                    string
		Failed, Recovery, Badge bool
	}
	var got []brief
	for _, r := range rows {
		got = append(got, brief{r.Kind, r.Failed, r.Recovery, r.Badge})
	}
	want := []brief{
		{"start", false, false, false},
		{"model", false, false, false},
		{"tool_call", false, false, false},
		{"tool_result", true, false, false},
		{"model", false, true, true}, // the recovery starts here
		{"tool_call", false, true, false},
		{"tool_result", false, true, false},
		{"model", false, false, false},
		{"answer", false, false, false},
		{"stop", false, false, false},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rows:\n got %+v\nwant %+v", got, want)
	}
	if r := rows[1]; r.Label != "model request" || r.Detail != "310 + 22 tokens · qwen3-coder" || r.Latency != "41 ms" {
		t.Errorf("model row %+v", r)
	}
	if r := rows[0]; r.Detail != "2 tools offered" || r.Title != "calc_evaluate, gpu_status" {
		t.Errorf("start row %+v", r)
	}
	if r := rows[2]; !r.Code || r.Tool != "calc_evaluate" {
		t.Errorf("call row %+v", r)
	}
	for _, tc := range []struct {
		e    agent.Event
		want string
	}{
		{agent.Event{Kind: agent.EventStop, Reason: agent.StopAnswer}, "answered"},
		{agent.Event{Kind: agent.EventStop, Reason: agent.StopAnswer, Text: "answered after 2 steps"}, "answered after 2 steps"},
		{agent.Event{Kind: agent.EventStop, Reason: agent.StopMaxSteps, Text: "6 steps"}, "step cap reached: 6 steps"},
		{agent.Event{Kind: agent.EventStop, Reason: agent.StopBusy, Text: "2 running"}, "busy: 2 running"},
		{agent.Event{Kind: agent.EventStop, Reason: "new_reason"}, "new_reason"},
	} {
		if got := askRows([]agent.Event{tc.e})[0].Detail; got != tc.want {
			t.Errorf("stop %q: %q, want %q", tc.e.Reason, got, tc.want)
		}
	}
	// Parallel calls in one step, one failing: one recovery badge next step.
	par := askRows([]agent.Event{
		{Kind: agent.EventToolResult, Step: 1, Tool: "a", IsError: true},
		{Kind: agent.EventToolResult, Step: 1, Tool: "b"},
		{Kind: agent.EventModel, Step: 2},
		{Kind: agent.EventAnswer, Step: 2},
		{Kind: agent.EventStop, Step: 2, Reason: agent.StopAnswer},
	})
	if !par[2].Badge || par[3].Badge || !par[3].Recovery || par[4].Recovery {
		t.Errorf("parallel rows %+v", par)
	}
}

// TestAskPage: disabled without an asker; with one, the page has the
// form, the script endpoint streams SSE behind CSRF, the form fallback
// renders the whole timeline with the failed call and the recovery marked,
// and every string from the loop is escaped.
func TestAskPage(t *testing.T) {
	t.Run("disabled", func(t *testing.T) {
		ev := newAskEnv(t, false, (*agent.Limiter)(nil)) // what a daemon without an agent holds
		c := ev.client(t)
		resp, body := do(t, c, "GET", ev.srv.URL+"/ask", nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="ask-disabled"`) || !strings.Contains(body, "agent is disabled") || strings.Contains(body, `id="ask-form"`) {
			t.Fatalf("disabled page %d:\n%s", resp.StatusCode, body)
		}
		tok := csrfMeta(t, body)
		resp, body = ev.postStream(t, c, tok, `{"question":"q"}`, nil)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "agent disabled") {
			t.Errorf("stream while disabled: %d %s", resp.StatusCode, body)
		}
		resp, body = do(t, c, "POST", ev.srv.URL+"/ask", url.Values{"csrf": {tok}, "question": {"q"}}, nil)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "agent is disabled") {
			t.Errorf("form while disabled: %d", resp.StatusCode)
		}
	})

	fa := &fakeAsker{events: recoveryEvents()}
	ev := newAskEnv(t, false, fa)
	c := ev.client(t)
	resp, page := do(t, c, "GET", ev.srv.URL+"/ask", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /ask: %d", resp.StatusCode)
	}
	for _, w := range []string{`id="ask-form"`, `action="/ask"`, `name="question"`, `src="/static/ask.js"`, `<a href="/ask" aria-current="page">Ask</a>`} {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
	tok := csrfOf(t, page)

	t.Run("stream", func(t *testing.T) {
		resp, body := ev.postStream(t, c, tok, `{"question":"what is 6*7?"}`, nil)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("stream: %d %q\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		var kinds []string
		if err := agent.ReadEvents(strings.NewReader(body), func(e agent.Event) error { kinds = append(kinds, e.Kind); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(kinds) != 10 || kinds[9] != agent.EventStop {
			t.Errorf("kinds %q", kinds)
		}
	})
	t.Run("stream refusals", func(t *testing.T) {
		before := len(fa.questions())
		for _, tc := range []struct {
			name  string
			tok   string
			body  string
			extra map[string]string
			code  int
		}{
			{"no CSRF", "", `{"question":"q"}`, nil, http.StatusForbidden},
			{"wrong CSRF", "AAAA" + tok[4:], `{"question":"q"}`, nil, http.StatusForbidden},
			{"cross-site", tok, `{"question":"q"}`, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
			{"foreign origin", tok, `{"question":"q"}`, map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
			{"empty question", tok, `{"question":"  "}`, nil, http.StatusBadRequest},
			{"not JSON", tok, `question=q`, nil, http.StatusBadRequest},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, body := ev.postStream(t, c, tc.tok, tc.body, tc.extra)
				if resp.StatusCode != tc.code || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
					t.Errorf("status %d %q, want %d JSON:\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.code, body)
				}
			})
		}
		if n := len(fa.questions()); n != before {
			t.Errorf("refused requests ran the loop %d times", n-before)
		}
	})
	t.Run("form fallback", func(t *testing.T) {
		resp, body := do(t, c, "POST", ev.srv.URL+"/ask", url.Values{"csrf": {tok}, "question": {"what is " + evilText}}, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("form: %d\n%s", resp.StatusCode, body)
		}
		for _, w := range []string{
			`class="ev ev-tool_result failed"`, `<span class="badge sev-fail ev-failed">failed</span>`,
			`class="ev ev-model recovery"`, `<span class="badge sev-warn ev-recovery">recovery</span>`,
			`class="ev ev-answer"`, `class="ev ev-stop stop-answer"`, "answered",
			`<code class="ev-tool">calc_evaluate</code>`, "310 &#43; 22 tokens", "&lt;script&gt;alert(1)&lt;/script&gt;",
		} {
			if !strings.Contains(body, w) {
				t.Errorf("timeline lacks %q", w)
			}
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("unescaped markup from the loop:\n%s", body)
		}
		if q := fa.questions(); q[len(q)-1] != "what is "+evilText {
			t.Errorf("asked %q", q[len(q)-1])
		}
		resp, body = do(t, c, "POST", ev.srv.URL+"/ask", url.Values{"csrf": {tok}, "question": {" "}}, nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Type a question first.") {
			t.Errorf("blank form: %d", resp.StatusCode)
		}
		resp, _ = do(t, c, "POST", ev.srv.URL+"/ask", url.Values{"question": {"q"}}, nil)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("form without CSRF: %d", resp.StatusCode)
		}
	})
	t.Run("static", func(t *testing.T) {
		resp, js := do(t, c, "GET", ev.srv.URL+"/static/ask.js", nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(js, "getReader") || strings.Contains(js, "innerHTML") {
			t.Errorf("ask.js: %d (must stream with a reader and never use innerHTML)", resp.StatusCode)
		}
	})
}

// TestAskPageLimit: the panel shares the daemon's Limiter: while the API
// holds the only slot, the page's stream answers 429 and the form says so.
func TestAskPageLimit(t *testing.T) {
	fa := &fakeAsker{events: recoveryEvents(), hold: make(chan struct{})}
	lim := agent.NewLimiter(fa, 1)
	ev := newAskEnv(t, false, lim)
	// Occupy the slot the way another front door would.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		lim.Ask(ctx, "first", func(agent.Event) {})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for len(fa.questions()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first question never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := ev.client(t)
	_, page := do(t, c, "GET", ev.srv.URL+"/ask", nil, nil)
	tok := csrfOf(t, page)
	resp, body := ev.postStream(t, c, tok, `{"question":"second"}`, nil)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "limit is 1") {
		t.Errorf("stream while busy: %d %s", resp.StatusCode, body)
	}
	resp, body = do(t, c, "POST", ev.srv.URL+"/ask", url.Values{"csrf": {tok}, "question": {"third"}}, nil)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "limit is 1") || !strings.Contains(body, "stop-busy") {
		t.Errorf("form while busy: %d", resp.StatusCode)
	}
	close(fa.hold)
	<-done
}

// TestAskPageLogin: beyond loopback the page and its stream need a
// session; a session does not open POST /api/ask (that still wants the
// bearer token).
func TestAskPageLogin(t *testing.T) {
	fa := &fakeAsker{events: recoveryEvents()}
	ev := newAskEnv(t, true, fa)
	c := ev.client(t)
	resp, _ := do(t, c, "GET", ev.srv.URL+"/ask", nil, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("anonymous /ask: %d, want the login redirect", resp.StatusCode)
	}
	_, login := do(t, c, "GET", ev.srv.URL+"/login", nil, nil)
	tok := csrfOf(t, login)
	resp, _ = ev.postStream(t, c, tok, `{"question":"q"}`, nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("anonymous stream: %d, want 401", resp.StatusCode)
	}
	resp, _ = do(t, c, "POST", ev.srv.URL+"/login", url.Values{"csrf": {tok}, "token": {ev.token}, "next": {"/ask"}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	resp, page := do(t, c, "GET", ev.srv.URL+"/ask", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/ask after login: %d", resp.StatusCode)
	}
	tok = csrfOf(t, page)
	resp, body := ev.postStream(t, c, tok, `{"question":"q"}`, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Contains([]byte(body), []byte("event: stop")) {
		t.Errorf("stream with a session: %d\n%s", resp.StatusCode, body)
	}
	if n := len(fa.questions()); n != 1 {
		t.Errorf("the loop ran %d times, want 1", n)
	}
}
