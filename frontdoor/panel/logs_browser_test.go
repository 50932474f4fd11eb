package panel

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
)

// brokenOllama makes the Ollama backend a program that writes two lines
// (one with markup) and exits: a switch to llama fails at its ready step
// with those lines as the step's journal, and rolls back to coder.
func brokenOllama(c *config.Config) {
	c.Backends.Ollama.Exec = []string{"/bin/sh", "-c", `echo 'ollama: <b>cannot</b> open /dev/nvidia0'; echo 'ollama: giving up'; exit 3`}
}

// TestBrowserLogs opens /logs after a failed switch: the failed step's
// journal is pinned (escaped, with the switch id and step), a line the
// active backend writes appears without a reload, and at phone width the
// pages do not overflow and the Switch button is on screen.
func TestBrowserLogs(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder", Hook: brokenOllama}})
	evs, err := ev.f.SwitchTo(t, "llama")
	if err == nil {
		t.Fatalf("the switch to the broken llama succeeded:%s", appliancetest.Describe(evs))
	}
	var id, step string
	for _, e := range evs {
		if e.Kind == "step" && e.Status == "failed" && len(e.Journal) > 0 {
			id, step = e.SwitchID, e.Step
		}
	}
	if id == "" {
		t.Fatalf("no failed step with a journal:%s", appliancetest.Describe(evs))
	}
	ctx := newBrowser(t)
	cons := watchConsole(ctx)
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.Click(chromedp.CSS(`nav a[href="/logs"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#pinned pre.journal`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("logs page: %v\n%s", err, html)
	}
	pinned, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#pinned")))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{id, step, "llama", "ollama: <b>cannot</b> open /dev/nvidia0", "ollama: giving up"} {
		if !strings.Contains(pinned, w) {
			t.Errorf("pinned excerpt lacks %q:\n%s", w, pinned)
		}
	}
	checkLiveLine(t, tctx, ev)
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('main b, main i').length`)); err != nil || n != 0 {
		t.Errorf("journal markup became elements: %d (%v)", n, err)
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-logs.png", shot)
	// A long line without spaces (a vLLM arg dump, a path) must wrap on a
	// phone rather than run off the card.
	long := "long-line-" + strings.Repeat("x", 300)
	appendLog(t, unitLog(ev.f.Cfg, ev.f.Sup.State().Unit), long)
	checkPhoneWidth(t, tctx, ev)
	checkDoctorPhone(t, tctx, ev.srv.URL)
	checkLogsPhone(t, tctx, ev.srv.URL, long)
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}

// checkLiveLine writes a line into the tailed unit's log and waits until
// the page shows it, with no reload in between.
func checkLiveLine(t *testing.T, ctx context.Context, ev *env) {
	t.Helper()
	unit, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.__gpuhostNoReload = true; document.querySelector('#tail').dataset.unit`))
	if err != nil {
		t.Fatal(err)
	}
	if want := ev.f.Sup.State().Unit; unit != want {
		t.Errorf("the tail follows %q, not the active unit %q", unit, want)
	}
	line := fmt.Sprintf("live line %d <i>from the backend</i>", time.Now().UnixNano())
	appendLog(t, unitLog(ev.f.Cfg, unit), line)
	deadline := time.Now().Add(15 * time.Second)
	for {
		text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#tail').textContent`))
		if err == nil && strings.Contains(text, line) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new journal line %q did not appear within 15 s (%v):\n%s", line, err, text)
		}
		time.Sleep(200 * time.Millisecond)
	}
	noReload, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`))
	if err != nil || !noReload {
		t.Errorf("the page reloaded to show the new line (%v, %v)", noReload, err)
	}
}

// checkPhoneWidth narrows the viewport to 390 px: no page scrolls
// sideways, and on /profiles every Switch button lies within the viewport.
func checkPhoneWidth(t *testing.T, ctx context.Context, ev *env) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-logs-390.png", shot)
	for _, pg := range []struct{ path, wait string }{
		{"/", "svg.bar .bar-fg"}, {"/profiles", `tr[data-profile="llama"] button`}, {"/doctor", "table.checks"}, {"/logs", "#tail"}, {"/bench", "main .card"}, {"/ask", "main .card"},
		{"/activity", "main .card"}, {"/mail", "main .card"},
	} {
		if err := chromedp.Do(ctx,
			chromedp.Navigate(ev.srv.URL+pg.path),
			chromedp.WaitVisible(chromedp.CSS(pg.wait)),
		); err != nil {
			t.Fatalf("%s at 390 px: %v", pg.path, err)
		}
		w, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`document.documentElement.scrollWidth`))
		if err != nil || w > 390 {
			t.Errorf("%s at 390 px is %v px wide (%v): it scrolls sideways", pg.path, w, err)
		}
		if pg.path != "/profiles" {
			continue
		}
		rights, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](
			`Array.from(document.querySelectorAll('form.switch-form button.primary')).filter((b) => b.offsetParent).map((b) => b.getBoundingClientRect().right)`))
		if err != nil || len(rights) == 0 {
			t.Fatalf("Switch buttons at 390 px: %v (%v)", rights, err)
		}
		for _, r := range rights {
			if r > 390 {
				t.Errorf("a Switch button ends at %.0f px, beyond the 390 px viewport", r)
			}
		}
		shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		saveArtifact(t, "panel-profiles-390.png", shot)
	}
}
