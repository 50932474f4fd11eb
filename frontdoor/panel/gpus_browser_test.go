package panel

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gpuhost/internal/activity"
)

// TestBrowserGPULanes walks a two-GPU box in headless Chromium: the
// dashboard's two lanes, each kept current by the live poll with its own
// GPU's figures; the profiles grouped by GPU set, a Switch from the GPU 0
// group followed live to the end; at 390 px the groups stay within the
// screen; and on Activity a request arriving live shows its GPU set.
func TestBrowserGPULanes(t *testing.T) {
	ev := twoGPUEnv(t, "llama", nil)
	rec := activity.New(activity.Options{LogSize: 50, GPU: ev.f.Sup, Events: ev.f.Sup})
	ev.p.SetActivity(rec)
	ctx := newBrowser(t)
	cons := watchConsole(ctx)
	tctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()

	// Dashboard: the lanes, then each lane's gauges rewritten by the poll
	// with its own GPU's memory (GPU 1 holds llama's 6.1 GiB, GPU 0 none).
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#gpu-1 svg.bar .bar-fg`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	heads, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('section.lane h2')).map((h) => h.textContent.trim())`))
	if err != nil || strings.Join(heads, "|") != "GPU 0 GPU-5a1f4090…|GPU 1 GPU-5a1f4091…" {
		t.Errorf("lane headings %q (%v)", heads, err)
	}
	waitText(t, tctx, `#gpu-1 dd.holders`, "llama (gpuhost-ollama.service)")
	if err := chromedp.Do(tctx, chromedp.Evaluate[chromedp.Void](
		`document.querySelectorAll('[data-live]').forEach((el) => { el.textContent = 'stale'; }); document.querySelector('#gpu-1 .bar-fg').setAttribute('width', '0')`)); err != nil {
		t.Fatal(err)
	}
	waitText(t, tctx, `#gpu-1 [data-live="mem_used"]`, "6.1")
	waitText(t, tctx, `#gpu-0 [data-live="mem_used"]`, "0.0")
	if w, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('#gpu-1 .bar-fg').getAttribute('width')`)); err != nil || w == "0" {
		t.Errorf("GPU 1's memory bar was not redrawn by the poll: width %q (%v)", w, err)
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-lanes-dashboard.png", shot)

	// Profiles: the groups in order; a Switch from the GPU 0 group runs
	// as every Switch does (the same form, followed over SSE).
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/profiles"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tbody[data-gpus="0"] tr[data-profile="coder"] button`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		t.Fatalf("profiles: %v", err)
	}
	groups, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('tr.lane-head th')).map((th) => th.firstChild.textContent.trim())`))
	if err != nil || strings.Join(groups, "|") != "GPU 0|GPU 1|GPU 0+1|auto" {
		t.Errorf("profile groups %q (%v)", groups, err)
	}
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`tbody[data-gpus="0"] tr[data-profile="coder"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`#progress.outcome-done`)),
		chromedp.WaitVisible(chromedp.CSS(`tbody[data-gpus="0"] tr.active[data-profile="coder"]`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("switch from the GPU 0 group: %v (console: %v)\n%s", err, cons.errors(), html)
	}
	if st := ev.f.Sup.State(); st.Profile != "coder" {
		t.Errorf("the daemon's state is %+v, not coder", st)
	}
	if shot, err = chromedp.Run(tctx, chromedp.FullScreenshot(100)); err == nil {
		saveArtifact(t, "panel-lanes-profiles.png", shot)
	}
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(phoneWidth, 844), chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(`tr.lane-head th`))); err != nil {
		t.Fatalf("profiles at %d px: %v", phoneWidth, err)
	}
	if w, err := chromedp.Run(tctx, chromedp.Evaluate[float64](`document.documentElement.scrollWidth`)); err != nil || w > phoneWidth {
		t.Errorf("/profiles at %d px is %v px wide (%v)", phoneWidth, w, err)
	}
	if shot, err = chromedp.Run(tctx, chromedp.FullScreenshot(100)); err == nil {
		saveArtifact(t, "panel-lanes-profiles-390.png", shot)
	}
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}

	// Activity: a request served by llama arrives live with its GPU set.
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/activity"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#requests-card th`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		t.Fatalf("activity: %v", err)
	}
	rec.Record(activity.Request{Time: time.Now(), Client: "127.0.0.1", Method: "POST", Path: "/v1/chat/completions", API: "chat",
		Model: "llama3.1:8b", Profile: "llama", Status: 200})
	waitText(t, tctx, `#requests tr[data-seq="1"] td.gpus`, "GPU 1")
	cols, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`[document.querySelectorAll('#requests-card thead th').length, document.querySelectorAll('#requests tr[data-seq="1"] td').length].map(String)`))
	if err != nil || len(cols) != 2 || cols[0] != cols[1] {
		t.Errorf("header cells vs the live row's cells: %v (%v)", cols, err)
	}
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}
