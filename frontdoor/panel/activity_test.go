package panel

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/internal/activity"
	"gpuhost/internal/sse"
	"gpuhost/internal/testkit"
)

// hostileModel stands for anything odd in a log entry: served names come
// from the config, but the page must escape whatever it shows.
const hostileModel = `<img src=x onerror="alert(1)">`

// newActivityEnv is a panel with an activity recorder on the fixture's
// Supervisor (GPU and events); the recorder is not running: tests sample.
func newActivityEnv(t *testing.T) (*env, *activity.Recorder) {
	t.Helper()
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	rec := activity.New(activity.Options{LogSize: 50, GPU: ev.f.Sup, Events: ev.f.Sup})
	ev.p.SetActivity(rec)
	return ev, rec
}

func seedRequests(rec *activity.Recorder) {
	now := time.Now()
	rec.Record(activity.Request{Time: now, Client: "127.0.0.1", Method: "POST", Path: "/v1/messages", API: "messages", Model: "qwen3-coder",
		Status: 200, Stream: true, PromptTokens: 1200, CompletionTokens: 101, TTFB: 150 * time.Millisecond, Duration: 350 * time.Millisecond})
	rec.Record(activity.Request{Time: now, Client: "192.0.2.7", Method: "POST", Path: "/v1/chat/completions", Model: hostileModel,
		Status: 503, Duration: 2 * time.Second, Held: 1500 * time.Millisecond})
	rec.Record(activity.Request{Time: now, Client: "127.0.0.1", Method: "POST", Path: "/v1/chat/completions", Status: 404, Duration: time.Millisecond})
}

// TestActivityPage: the server-rendered page lists the requests newest
// first, escaped, filtered by model and status; bad queries are 400s that
// name the value; the charts and the JSON history come from the history.
func TestActivityPage(t *testing.T) {
	ev, rec := newActivityEnv(t)
	seedRequests(rec)
	for range 3 {
		rec.Sample(context.Background())
	}
	c := ev.client(t)
	resp, page := do(t, c, http.MethodGet, ev.srv.URL+"/activity", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("GET /activity: %d %v", resp.StatusCode, resp.Header)
	}
	if strings.Contains(page, hostileModel) || !strings.Contains(page, "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;") {
		t.Errorf("the hostile model is not escaped:\n%s", page)
	}
	if !strings.Contains(page, "<td>messages</td>") || !strings.Contains(page, "<td>/v1/chat/completions</td>") {
		t.Error("the rows do not name their API (messages) or path")
	}
	if strings.Contains(page, " style=") {
		t.Error("the page has a style attribute (the CSP forbids it)")
	}
	i503, i200 := strings.Index(page, ">503<"), strings.Index(page, ">200<")
	if i503 < 0 || i200 < 0 || i503 > i200 {
		t.Errorf("rows not newest first (503 at %d, 200 at %d)", i503, i200)
	}
	for _, w := range []string{`data-after="3"`, "192.0.2.7", "1200", "101", "500.0", "150 ms", "1.5 s", `href="/activity" aria-current="page"`, `data-metric="vram"`, "<path class=\"chart-line\" d=\"M"} {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
	_, page = do(t, c, http.MethodGet, ev.srv.URL+"/activity?status=5xx", nil, nil)
	if !strings.Contains(page, ">503<") || strings.Contains(page, ">200<") || strings.Contains(page, ">404<") {
		t.Errorf("status=5xx shows other rows")
	}
	_, page = do(t, c, http.MethodGet, ev.srv.URL+"/activity?model=qwen3-coder", nil, nil)
	if !strings.Contains(page, ">200<") || strings.Contains(page, ">503<") {
		t.Errorf("model=qwen3-coder shows other rows")
	}
	_, page = do(t, c, http.MethodGet, ev.srv.URL+"/activity?model=%3Cscript%3Ex", nil, nil)
	if strings.Contains(page, "<script>x") || !strings.Contains(page, "No /v1 requests match the filter") {
		t.Errorf("a hostile model filter is echoed unescaped or matched something")
	}
	for _, q := range []string{"status=9xx", "window=2h", "window=10s", "window=soon", "model=" + strings.Repeat("m", 200)} {
		resp, body := do(t, c, http.MethodGet, ev.srv.URL+"/activity?"+q, nil, map[string]string{"Accept": "application/json"})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "bad activity query") {
			t.Errorf("?%s: %d %s", q, resp.StatusCode, body)
		}
	}
	resp, body := do(t, c, http.MethodGet, ev.srv.URL+"/activity/history?window=5m", nil, map[string]string{"Accept": "application/json"})
	var w activity.Window
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &w) != nil || len(w.Samples) != 3 || !w.Samples[0].GPU || w.Samples[0].TotalMiB == 0 {
		t.Errorf("history: %d %s", resp.StatusCode, body)
	}
	if len(w.Switches) != 0 { // the recorder did not run: no events observed
		t.Errorf("switches without Run: %+v", w.Switches)
	}
	resp, body = do(t, c, http.MethodGet, ev.srv.URL+"/activity/charts?window=1h", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="charts"`) || !strings.Contains(body, `data-window="1h"`) || strings.Contains(body, "<html") {
		t.Errorf("charts: %d %s", resp.StatusCode, body)
	}
}

// TestActivityOff: without SetActivity the page says so and the endpoints
// are 404s.
func TestActivityOff(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	resp, page := do(t, c, http.MethodGet, ev.srv.URL+"/activity", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Activity is not recorded") {
		t.Errorf("GET /activity without a recorder: %d\n%s", resp.StatusCode, page)
	}
	for _, path := range []string{"/activity/events", "/activity/history", "/activity/charts"} {
		if resp, _ := do(t, c, http.MethodGet, ev.srv.URL+path, nil, map[string]string{"Accept": "application/json"}); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s without a recorder: %d", path, resp.StatusCode)
		}
	}
}

// TestActivityEvents: the live stream sends the requests after ?after=,
// filtered, oldest first, then the new ones as they are recorded; a
// reconnect with Last-Event-ID resumes after it.
func TestActivityEvents(t *testing.T) {
	ev, rec := newActivityEnv(t)
	seedRequests(rec)
	read := func(query, lastID string, want int, during func()) []requestRow {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ev.srv.URL+"/activity/events?"+query, nil)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("events: %d %v", resp.StatusCode, resp.Header)
		}
		if during != nil {
			go during()
		}
		rd := sse.NewReader(resp.Body, 0)
		var rows []requestRow
		for len(rows) < want {
			e, err := rd.Next()
			if err != nil {
				t.Fatalf("after %d rows: %v", len(rows), err)
			}
			var r requestRow
			if e.Type != "request" || json.Unmarshal(e.Data, &r) != nil || e.ID != strconv.FormatUint(r.Seq, 10) {
				t.Fatalf("event %s %q id %s", e.Type, e.Data, e.ID)
			}
			rows = append(rows, r)
		}
		return rows
	}
	rows := read("after=0", "", 3, nil)
	if rows[0].Seq != 1 || rows[2].Seq != 3 || rows[1].Model != hostileModel || rows[1].Held != "1.5 s" || rows[0].TokPS != "500.0" {
		t.Errorf("backlog rows %+v", rows)
	}
	rows = read("after=0&status=error", "", 3, func() {
		time.Sleep(100 * time.Millisecond)
		rec.Record(activity.Request{Model: "qwen3-coder", Status: 200})
		rec.Record(activity.Request{Model: "qwen3-coder", Status: 502})
	})
	if rows[0].Seq != 2 || rows[1].Seq != 3 || rows[2].Seq != 5 || rows[2].StatusClass != "sev-fail" {
		t.Errorf("filtered rows %+v", rows)
	}
	if rows := read("after=0", "4", 1, nil); rows[0].Seq != 5 {
		t.Errorf("Last-Event-ID 4 resumed at %+v", rows)
	}
	if !waitSubscribers(rec, 0) {
		t.Errorf("%d subscriptions left open after the clients left", rec.Subscribers())
	}
}

func waitSubscribers(rec *activity.Recorder, n int) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if rec.Subscribers() == n {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// TestLive: /live gives the pill's text and the dashboard's gauges, from
// the history's fresh sample or (none) a snapshot, and follows a switch.
func TestLive(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	get := func() liveAnswer {
		t.Helper()
		resp, body := do(t, c, http.MethodGet, ev.srv.URL+"/live", nil, map[string]string{"Accept": "application/json"})
		var a liveAnswer
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &a) != nil {
			t.Fatalf("/live: %d %s", resp.StatusCode, body)
		}
		return a
	}
	a := get()
	if a.Phase != "active" || !strings.HasPrefix(a.Pill, "coder · ") || a.Gauges["mem_total"] != "24.0" || a.MemPct <= 0 {
		t.Errorf("/live without a recorder: %+v", a)
	}
	rec := activity.New(activity.Options{GPU: ev.f.Sup})
	ev.p.SetActivity(rec)
	rec.Sample(context.Background())
	if b := get(); b.Gauges["mem_used"] != a.Gauges["mem_used"] || b.Gauges["mem_total"] != "24.0" {
		t.Errorf("/live from the sample %+v, from the snapshot %+v", b, a)
	}
	if _, err := ev.f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	if a := get(); !strings.HasPrefix(a.Pill, "llama · ") {
		t.Errorf("/live after the switch: %+v", a)
	}
}

// TestActivitySwitchDurations: the Activity page's switch list shows each
// switch's duration and steps; a real switch of the daemon (the fixture's
// Supervisor, its events on the daemon's bus) gets its duration, and of
// four wakes published on that bus the one whose standby step waited its
// release timeout (over 3× the median of its profile and mode) stands
// out, with that step marked long and its message shown.
func TestActivitySwitchDurations(t *testing.T) {
	ev, rec := newActivityEnv(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go rec.Run(ctx)
	if _, err := ev.f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	const stalled = "ollama.service not in standby (holds 6200 MiB in standby, above its measured residual 500 MiB); it will be stopped"
	for i, standbyMS := range []float64{20, 22, 21, 20010} {
		id := "wake-" + strconv.Itoa(i)
		msg := "ok"
		if standbyMS > 1000 {
			msg = stalled
		}
		ev.f.Sup.Publish(api.Event{Kind: "switch", SwitchID: id, Profile: "coder", Status: "started"})
		ev.f.Sup.Publish(api.Event{Kind: "step", SwitchID: id, Profile: "llama", Step: "standby", Status: "done", DurationMS: standbyMS, Message: msg})
		ev.f.Sup.Publish(api.Event{Kind: "step", SwitchID: id, Profile: "coder", Step: "wake", Status: "done", DurationMS: 200})
		ev.f.Sup.Publish(api.Event{Kind: "switch", SwitchID: id, Profile: "coder", Status: "done", DurationMS: standbyMS + 200})
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		sws := rec.Window(time.Hour).Switches
		return len(sws) > 0 && sws[len(sws)-1].ID == "wake-3" && sws[len(sws)-1].Status == "done"
	}, "the history did not see the wakes")
	c := ev.client(t)
	_, body := do(t, c, http.MethodGet, ev.srv.URL+"/activity/charts?window=1h", nil, nil)
	page := html.UnescapeString(body)
	items := regexp.MustCompile(`(?s)<li data-status="[a-z]+"(?: class="switch-slow" data-slow="true")?>.*?</ol></li>`).FindAllString(page, -1)
	// The fixture's activation of coder, the switch to llama, the 4 wakes.
	if len(items) != 6 {
		t.Fatalf("%d switch items, want 6:\n%s", len(items), page)
	}
	items = items[1:]
	real := items[0]
	if !strings.Contains(real, "switch to <strong>llama</strong>") || !regexp.MustCompile(`<span class="switch-duration">[0-9.]+ (ms|s)</span>`).MatchString(real) ||
		!strings.Contains(real, "load_model") || strings.Contains(real, "switch-slow") {
		t.Errorf("the real switch lacks its duration or steps:\n%s", real)
	}
	for i, it := range items[1:] {
		slow := strings.Contains(it, `class="switch-slow"`)
		if slow != (i == 3) {
			t.Errorf("wake %d: slow %v:\n%s", i, slow, it)
		}
	}
	stall := items[4]
	for _, w := range []string{`<span class="switch-duration">20.2 s</span>`, "slow: 91.2× the median 222 ms", `<li class="step-long"`, "standby 20.0 s <strong>long</strong> <span class=\"step-msg\">" + stalled, "wake 200 ms</li>"} {
		if !strings.Contains(stall, w) {
			t.Errorf("the stalled wake lacks %q:\n%s", w, stall)
		}
	}
}
