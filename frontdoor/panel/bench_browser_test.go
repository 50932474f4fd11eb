package panel

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	"gpuhost/bench/benchapi"
)

// withBench wires a bench service as serve does (progress on the
// Supervisor's bus) with a short default run, and enables the Bench page.
func withBench(store **bench.Store) func(ev *env, e *echo.Echo) {
	return func(ev *env, e *echo.Echo) {
		f := ev.f
		*store = bench.NewStore(f.Cfg.StateDir, f.Log)
		svc := benchapi.NewService(benchapi.ServiceOptions{
			Store:   *store,
			Daemon:  benchapi.DaemonFuncs{SwitchingFunc: func() bool { return false }, AwaitActiveFunc: f.Sup.AwaitActive},
			Publish: func(msg string) { f.Sup.Publish(api.Event{Kind: "bench", Message: msg}) },
			Log:     f.Log,
			Defaults: bench.Options{Repeats: 1, PrefillTokens: []int{64}, DecodeTokens: []int{16},
				Concurrency: []int{2}, ServingRequests: 2},
			MinPublishInterval: -1,
		})
		ev.srvCleanup = append(ev.srvCleanup, svc.Close)
		svc.Register(e)
		ev.p.SetBench(benchSrc{svc, *store})
	}
}

// TestBrowserBench starts a benchmark from the Bench page: the progress
// lines appear as the run publishes them, and the finished run's row is
// in the results table, with no reload of the page in between; then a
// result uploaded by the CLI appears in the open page's table too.
func TestBrowserBench(t *testing.T) {
	var store *bench.Store
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}, register: withBench(&store)})
	ctx := newBrowser(t)
	cons := watchConsole(ctx)
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.Click(chromedp.CSS(`nav a[href="/bench"]`)),
		chromedp.WaitVisible(chromedp.CSS(`form.bench-form button`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("bench page: %v\n%s", err, html)
	}
	before, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil || !strings.Contains(before, "No benchmark results yet") {
		t.Fatalf("bench page before the run: %q (%v)", before, err)
	}
	if err := chromedp.Do(tctx,
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostNoReload = true`),
		// Streams opened from here on are counted: the run is followed on
		// the stream the page already reads.
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostStreams = 0;
			window.EventSource = class extends window.EventSource {
				constructor(...a) { super(...a); window.__gpuhostStreams++; }
			}`),
		chromedp.Click(chromedp.CSS(`form.bench-form button`)),
		chromedp.WaitVisible(chromedp.CSS(`#bench-live .bench-lines li`)),
		chromedp.WaitReady(chromedp.CSS(`#bench-live[data-refreshed="true"]`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("bench run in the browser: %v (console: %v)\n%s", err, cons.errors(), html)
	}
	noReload, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`))
	if err != nil || !noReload {
		t.Fatalf("the page reloaded during the run (marker %v, %v): the progress did not come over SSE", noReload, err)
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`window.__gpuhostStreams`)); err != nil || n != 0 {
		t.Errorf("the run opened %d more event streams (%v), want 0: one per page", n, err)
	}
	all, _, err := store.List()
	if err != nil || len(all) != 1 {
		t.Fatalf("stored results: %d (%v), want 1", len(all), err)
	}
	id := all[0].ID
	live, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#bench-live")))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("progress: %s", live)
	for _, w := range []string{id, "coder", "started on profile coder", "decode", "finished, " + all[0].Status} {
		if !strings.Contains(live, w) {
			t.Errorf("the live progress lacks %q:\n%s", w, live)
		}
	}
	table, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#bench-results")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table, id) || strings.Contains(table, "No benchmark results yet") {
		t.Errorf("the results table does not show %s after the run:\n%s", id, table)
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('#bench-results img.chart').length`)); err != nil || n != 1 {
		t.Errorf("chart images after the refresh: %d (%v), want 1", n, err)
	}
	// A result the CLI uploads (`gpuhost bench run` against the daemon)
	// shows up in the open page's table, again without a reload.
	up := *all[0]
	up.ID = bench.NewID(time.Now().Add(time.Hour), "cli")
	body, err := json.Marshal(&up)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(ev.srv.URL+"/api/bench/results", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	if err := chromedp.Do(tctx, chromedp.WaitReady(chromedp.CSS(`body[data-bench-stored="`+up.ID+`"]`))); err != nil {
		t.Fatalf("the uploaded %s did not reach the open page: %v (console: %v)", up.ID, err, cons.errors())
	}
	table, err = chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#bench-results")))
	if err != nil || !strings.Contains(table, up.ID) || !strings.Contains(table, id) {
		t.Errorf("the table after the upload lacks %s or %s (%v):\n%s", up.ID, id, err, table)
	}
	if noReload, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`)); err != nil || !noReload {
		t.Errorf("the page reloaded for the upload (marker %v, %v)", noReload, err)
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-bench-live.png", shot)
	checkBenchPhone(t, tctx, ev.srv.URL)
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}
