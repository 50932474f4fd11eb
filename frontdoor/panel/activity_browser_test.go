package panel

import (
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/activity"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
	"gpuhost/units"
)

// TestBrowserActivity opens /activity with the real /v1 proxy recording
// into a running recorder: requests sent through the proxy (and one with
// a hostile model name) appear without a reload, escaped; a switch shows
// in the header pill as it happens and as a band on the charts; the
// status filter works as a form GET; at 390 px the page does not scroll
// sideways; and the dashboard's gauges are rewritten by the live poll.
func TestBrowserActivity(t *testing.T) {
	var rec *activity.Recorder
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}, register: func(ev *env, e *echo.Echo) {
		rec = activity.New(activity.Options{GPU: ev.f.Sup, Events: ev.f.Sup})
		px := proxy.New(ev.f.Sup, ev.f.Cfg.Proxy, func() map[string]*units.Profile { return ev.f.Cfg.Profiles }, ev.f.Log)
		px.SetRecorder(rec)
		px.Register(e)
		ev.srvCleanup = append(ev.srvCleanup, px.Close)
	}})
	runCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go rec.Run(runCtx)
	v1(t, ev, "qwen3-coder", http.StatusOK)
	ev.p.SetActivity(rec)

	ctx := newBrowser(t)
	cons := watchConsole(ctx)
	tctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.Click(chromedp.CSS(`nav a[href="/activity"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#requests tr[data-seq="1"]`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostNoReload = true`),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("activity page: %v\n%s", err, html)
	}
	// Live rows: two through the proxy, one recorded with a hostile model.
	v1(t, ev, "qwen3-coder", http.StatusOK)
	v1(t, ev, "no-such-model", http.StatusNotFound)
	rec.Record(activity.Request{Time: time.Now(), Client: "192.0.2.7", Method: "POST", Path: "/v1/chat/completions", Model: hostileModel, Status: 503})
	waitText(t, tctx, `#requests tr[data-seq="4"]`, hostileModel)
	rows, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#requests tr')).map((tr) => tr.dataset.seq)`))
	if err != nil || strings.Join(rows, ",") != "4,3,2,1" {
		t.Errorf("rows %v (%v), want newest first 4,3,2,1", rows, err)
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('main img, main script').length`)); err != nil || n != 0 {
		t.Errorf("the hostile model became elements: %d (%v)", n, err)
	}
	waitText(t, tctx, `#requests tr[data-seq="3"]`, "404")
	waitText(t, tctx, `#requests tr[data-seq="2"]`, "qwen3-coder")

	// A switch: the pill follows it and the charts mark it, no reload.
	if _, err := ev.f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	waitText(t, tctx, `#phase`, "llama")
	if err := chromedp.Do(tctx, chromedp.WaitVisible(chromedp.CSS(`#charts rect.mark-done`))); err != nil {
		t.Fatalf("no switch mark on the charts: %v", err)
	}
	waitText(t, tctx, `#charts .switch-list`, "switch to llama")
	// Its duration and steps are listed with it (the list's last item).
	waitText(t, tctx, `#charts .switch-list > li:last-child .switch-duration`, "s")
	waitText(t, tctx, `#charts .switch-list > li:last-child .switch-steps`, "load_model")
	if noReload, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`)); err != nil || !noReload {
		t.Errorf("the page reloaded (%v, %v): rows, pill and charts must come live", noReload, err)
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('#charts path.chart-line').length`)); err != nil || n != len(metrics) {
		t.Errorf("%d chart lines (%v), want %d", n, err, len(metrics))
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-activity.png", shot)

	// The status filter without the script: a form GET.
	if err := chromedp.Do(tctx,
		chromedp.SetValue(chromedp.CSS(`form.filters select[name="status"]`), "4xx"),
		chromedp.Submit(chromedp.CSS(`form.filters select[name="status"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#requests[data-status="4xx"]`)),
	); err != nil {
		t.Fatalf("status filter: %v", err)
	}
	if rows, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#requests tr')).map((tr) => tr.dataset.seq)`)); err != nil || strings.Join(rows, ",") != "3" {
		t.Errorf("4xx rows %v (%v), want only 3", rows, err)
	}
	checkActivityPhone(t, tctx, ev)
	checkLiveGauges(t, tctx, ev)
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}

// v1 sends one small chat request through the proxy.
func v1(t *testing.T, ev *env, model string, want int) {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`
	resp, err := http.Post(ev.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("POST /v1 model %s: %d, want %d", model, resp.StatusCode, want)
	}
}

// waitText waits until the element's text contains want.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector(`+jsString(sel)+`) || {}).textContent || ''`))
		if err == nil && strings.Contains(text, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not show %q within 20 s (%v): %q", sel, want, err, text)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// checkActivityPhone: at 390 px the Activity page does not scroll sideways
// (the table scrolls inside its card).
func checkActivityPhone(t *testing.T, ctx context.Context, ev *env) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.EmulateViewport(390, 844),
		chromedp.Navigate(ev.srv.URL+"/activity"),
		chromedp.WaitVisible(chromedp.CSS(`#charts svg.chart`)),
	); err != nil {
		t.Fatalf("activity at 390 px: %v", err)
	}
	w, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`document.documentElement.scrollWidth`))
	if err != nil || w > 390 {
		t.Errorf("/activity at 390 px is %v px wide (%v): it scrolls sideways", w, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-activity-390.png", shot)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
}

// checkLiveGauges: on the dashboard the gauges are rewritten by the live
// poll: text the test puts there is replaced by the GPU's values, with no
// reload.
func checkLiveGauges(t *testing.T, ctx context.Context, ev *env) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`[data-live="mem_used"]`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostNoReload = true; document.querySelectorAll('[data-live]').forEach((el) => { el.textContent = 'stale'; })`),
	); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		stale, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Array.from(document.querySelectorAll('[data-live]')).filter((el) => el.textContent === 'stale').length`))
		if err == nil && stale == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d gauges still stale after 15 s (%v)", stale, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	used, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('[data-live="mem_total"]').textContent`))
	if err != nil || used != "24.0" {
		t.Errorf("total memory gauge %q (%v)", used, err)
	}
	if noReload, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`)); err != nil || !noReload {
		t.Errorf("the dashboard reloaded (%v, %v): the gauges must update in place", noReload, err)
	}
}

// curveGPU is a GPU whose readings follow the clock: an hour of a box
// that served one model, switched (VRAM down, then up), and served again
// under a load that comes and goes. Only for drawing an hour of charts.
type curveGPU struct{ clock *testkit.Clock }

func (g curveGPU) Snapshot(context.Context) (nvml.Snapshot, error) {
	m := g.clock.Now().Minute()
	busy := int(50 + 45*math.Sin(float64(m)/4))
	used := uint64(22600)
	if m >= 29 && m < 31 {
		busy, used = 0, 900 // the switch: the old backend gone, the new one loading
	}
	return nvml.Snapshot{Backend: "sim", Devices: []nvml.Device{{MemoryTotalMiB: 24564, MemoryUsedMiB: used,
		UtilizationGPU: busy, UtilizationMemory: busy / 2, PowerW: 60 + float64(busy)*3.5, TemperatureC: 38 + busy/3}}}, nil
}

// TestBrowserActivityHour draws an hour of history (1,800 samples taken on
// a test clock, requests recorded as they would have finished, a switch at
// half past) in the browser: six charts with their lines, the switch as a
// band, the hour's window selected. Its screenshot is what an operator
// sees after a working hour.
func TestBrowserActivityHour(t *testing.T) {
	clock := testkit.NewClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	rec := activity.New(activity.Options{GPU: curveGPU{clock}, Now: clock.Now})
	ctx := context.Background()
	for i := range 1800 {
		for k := range (i / 30) % 4 { // 0–3 requests in each 2 s
			rec.Record(activity.Request{Seq: 0, Time: clock.Now(), Client: "10.0.0." + strconv.Itoa(2+k), Method: "POST",
				Path: "/v1/chat/completions", Model: "qwen3-coder", Status: 200, Stream: true, PromptTokens: 900, CompletionTokens: 120,
				TTFB: 180 * time.Millisecond, Duration: 2 * time.Second})
		}
		if i == 870 {
			rec.Observe(api.Event{Kind: "switch", SwitchID: "s1", Profile: "llama", Status: "started", Time: clock.Now()})
		}
		if i == 930 {
			rec.Observe(api.Event{Kind: "switch", SwitchID: "s1", Profile: "llama", Status: "done", Time: clock.Now()})
		}
		rec.Sample(ctx)
		clock.Advance(2 * time.Second)
	}
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	ev.p.SetActivity(rec)
	bctx := newBrowser(t)
	cons := watchConsole(bctx)
	tctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/activity?window=1h"),
		chromedp.WaitVisible(chromedp.CSS(`#charts path.chart-line`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		t.Fatalf("activity page: %v", err)
	}
	lines, err := chromedp.Run(tctx, chromedp.Evaluate[[]int](`Array.from(document.querySelectorAll('#charts path.chart-line')).map((p) => (p.getAttribute('d').match(/L/g) || []).length)`))
	if err != nil || len(lines) != len(metrics) {
		t.Fatalf("chart lines %v (%v), want %d", lines, err, len(metrics))
	}
	for i, n := range lines {
		if n < 100 { // an hour bucketed to at most 300 points, one gap at most
			t.Errorf("chart %d has %d segments; an hour of samples should draw a long line", i, n)
		}
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('#charts rect.mark-done').length`)); err != nil || n == 0 {
		t.Errorf("switch bands: %d (%v), want the switch at half past", n, err)
	}
	shot, err := chromedp.Run(tctx, chromedp.CaptureScreenshot()) // the viewport: the charts and the newest rows
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-activity-hour.png", shot)
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}
