package panel

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserMail opens the Mail page in headless Chromium on a real
// triage worker (the demo mails and one with markup in its sender and
// subject): the posts, links, checkpoint and cost are there, no markup
// from a mail became an element, the "run again" form (dry run checked)
// shows the judged post without a reload of another page, nothing breaks
// the strict CSP (no console error), and at 390 px the page does not
// scroll sideways. Screenshots: panel-mail.png (1280 px) and
// panel-mail-390.png.
func TestBrowserMail(t *testing.T) {
	w, out := realMailWorker(t)
	ev := newMailEnv(t, w, func(p *Panel) { p.now = time.Now })
	ctx := newBrowser(t)
	cons := watchConsole(ctx)
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx,
		// The Supervisor here runs nothing (no GPU), so the walk starts on
		// the Mail page rather than the dashboard.
		chromedp.Navigate(ev.srv.URL+"/mail"),
		chromedp.WaitVisible(chromedp.CSS(`nav a[href="/mail"][aria-current="page"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#mail-recent table.mail-posts`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("mail page: %v\n%s", err, html)
	}
	text, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Offer for 40 additional licences?", "<script>alert('subject')</script> invoice", "<b>Mallory</b>",
		"Anna Berger", "unsubscribe", "UIDVALIDITY", "Cost per day"} {
		if !strings.Contains(text, want) {
			t.Errorf("page text lacks %q", want)
		}
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('main script, main b, main img').length`)); err != nil || n != 0 {
		t.Errorf("mail markup became elements: %d (%v)", n, err)
	}
	hrefs, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('main a[href]')).map((a) => a.href)`))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hrefs {
		if !strings.HasPrefix(h, "http://") && !strings.HasPrefix(h, "https://") {
			t.Errorf("a link on the page is not http(s): %q", h)
		}
	}
	checked, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.querySelector('#rerun-dry').checked`))
	if err != nil || !checked {
		t.Errorf("the dry-run box is not checked by default (%v)", err)
	}
	posts := strings.Count(out.String(), "key: ")
	if err := chromedp.Do(tctx,
		chromedp.SendKeys(chromedp.CSS(`#rerun-uid`), "2"),
		chromedp.Click(chromedp.CSS(`.rerun-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#rerun-result pre.post`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("run again: %v\n%s", err, html)
	}
	res, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#rerun-result")))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"UID 2", "dry run", "November newsletter", "Nothing posted (dry run)"} {
		if !strings.Contains(res, want) {
			t.Errorf("rerun result lacks %q:\n%s", want, res)
		}
	}
	if got := strings.Count(out.String(), "key: "); got != posts {
		t.Errorf("the dry run posted (%d posts, was %d)", got, posts)
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-mail.png", shot)

	if err := chromedp.Do(tctx,
		chromedp.EmulateViewport(390, 844),
		chromedp.Navigate(ev.srv.URL+"/mail"),
		chromedp.WaitVisible(chromedp.CSS(`#mail-recent table.mail-posts`)),
	); err != nil {
		t.Fatalf("mail page at 390 px: %v", err)
	}
	width, err := chromedp.Run(tctx, chromedp.Evaluate[float64](`document.documentElement.scrollWidth`))
	if err != nil || width > 390 {
		t.Errorf("/mail at 390 px is %v px wide (%v): it scrolls sideways", width, err)
	}
	right, err := chromedp.Run(tctx, chromedp.Evaluate[float64](`document.querySelector('.rerun-form button[type="submit"]').getBoundingClientRect().right`))
	if err != nil || right > 390 {
		t.Errorf("the Run again button ends at %v px, beyond the 390 px viewport (%v)", right, err)
	}
	shot, err = chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-mail-390.png", shot)
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}
