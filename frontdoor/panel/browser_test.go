package panel

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gpuhost/appliance/appliancetest"
	"gpuhost/internal/atomicfile"
	"gpuhost/internal/testkit/browser"
)

// artifactDir is where the browser test keeps its screenshots:
// $GPUHOST_ARTIFACTS when set (CI uploads it), else testdata/artifacts in
// this package (ignored by git).
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GPUHOST_ARTIFACTS")
	if dir == "" {
		abs, err := filepath.Abs(filepath.Join("testdata", "artifacts"))
		if err != nil {
			t.Fatal(err)
		}
		dir = abs
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("create artifact dir %s: %v", dir, err)
	}
	return dir
}

// newBrowser starts headless Chromium with a fresh profile, or skips (loudly)
// when it is not installed and GPUHOST_REQUIRE_BROWSER is not 1.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	return browser.Start(t)
}

// console collects what the page logs; an exception or an error entry
// (a CSP violation, a failed script) fails the test.
type console struct {
	mu   sync.Mutex
	msgs []string
}

func watchConsole(ctx context.Context) *console {
	c := &console{}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			// The network source reports every 4xx answer, and the refused
			// switch below is one on purpose.
			if m.IsException() || (m.Type == chromedp.ConsoleError && m.Source != "network") {
				c.mu.Lock()
				c.msgs = append(c.msgs, m.String())
				c.mu.Unlock()
			}
		}
	}()
	return c
}

func (c *console) errors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.msgs...)
}

func saveArtifact(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(artifactDir(t), name)
	if err := atomicfile.Write(path, data, 0o644); err != nil {
		t.Fatalf("write artifact: %v", err)
	}
	t.Logf("artifact: %s", path)
	return path
}

// TestBrowserSwitch drives the panel in headless Chromium: the dashboard,
// then Profiles, then Switch on another profile, following the live
// progress over SSE until the page shows the new profile active. The
// "login" case runs the same on a config that listens beyond loopback: the
// browser logs in with the API token, and its EventSource is authenticated
// by the session cookie alone.
func TestBrowserSwitch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		public bool
	}{{"loopback", false}, {"login", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ev := newEnv(t, envOptions{public: tc.public, fixture: appliancetest.Options{Activate: "coder"}})
			ctx := newBrowser(t)
			cons := watchConsole(ctx)
			tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
			defer cancel()
			if tc.public {
				browserLogin(t, tctx, ev)
			}
			browserSwitch(t, tctx, ev, cons, !tc.public)
			if errs := cons.errors(); len(errs) > 0 {
				t.Errorf("browser console errors: %q", errs)
			}
		})
	}
}

// browserLogin opens the dashboard, is sent to the login form, and logs in.
func browserLogin(t *testing.T, ctx context.Context, ev *env) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
	); err != nil {
		t.Fatalf("login page: %v", err)
	}
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || !strings.Contains(loc, "/login?next=%2F") {
		t.Errorf("the dashboard did not send the browser to the login: %q (%v)", loc, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-login.png", shot)
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), ev.token),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS(`form.logout button`)),
	); err != nil {
		t.Fatalf("log in: %v", err)
	}
	// The session cookie is not readable by script (HttpOnly).
	cookies, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`))
	if err != nil || strings.Contains(cookies, sessionCookie) {
		t.Errorf("document.cookie = %q (%v): the session cookie is visible to script", cookies, err)
	}
}

// browserSwitch runs the dashboard → Profiles → Switch walk and checks the
// live progress; screenshots the pages when shots is set.
func browserSwitch(t *testing.T, tctx context.Context, ev *env, cons *console, shots bool) {
	t.Helper()
	// Dashboard: GPU, memory bar, the active profile.
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS("svg.bar .bar-fg")),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	dash, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"NVIDIA GeForce RTX 4090", "Memory", "coder", "healthy"} {
		if !strings.Contains(dash, w) {
			t.Errorf("dashboard lacks %q:\n%s", w, dash)
		}
	}

	// Profiles, by the navigation link. A profile that fails the doctor is
	// refused in place, with the reason and a way to force it.
	if err := chromedp.Do(tctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/profiles"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-profile="llama"] button`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)), // the script has hooked the buttons
		chromedp.Click(chromedp.CSS(`tr[data-profile="coder-greedy"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`#notice button.danger`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("doctor refusal in the browser: %v (console: %v)\n%s", err, cons.errors(), html)
	}
	notice, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#notice")))
	if err != nil || !strings.Contains(notice, "fails the doctor") || !strings.Contains(notice, "0.96") || !strings.Contains(notice, "Switch to coder-greedy anyway") {
		t.Errorf("refusal notice %q (%v)", notice, err)
	}
	if err := chromedp.Do(tctx,
		chromedp.WaitEnabled(chromedp.CSS(`tr[data-profile="llama"] button`)),
		// A marker that survives only while no page load happens: the
		// progress below must come from the script and SSE, not a reload.
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostNoReload = true`),
		chromedp.Click(chromedp.CSS(`tr[data-profile="llama"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`#progress .steps li`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.active[data-profile="llama"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#progress.outcome-done`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("switch in the browser: %v (console: %v)\n%s", err, cons.errors(), html)
	}
	noReload, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`))
	if err != nil || !noReload {
		t.Fatalf("the page reloaded during the switch (marker %v, %v): the progress did not come over SSE", noReload, err)
	}
	progress, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#progress")))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("progress: %s", strings.Join(strings.Fields(progress), " "))
	for _, re := range []string{
		`Switch to llama`, `stopped \d+ ms`, `VRAM released \d+\.\d → \d+\.\d GiB`, `started`, `ready`,
		`model loaded`, `verified · \d+\.\d/24\.0 GiB used`, `llama is active \(total [\d.]+ m?s\)`,
	} {
		if !regexp.MustCompile(re).MatchString(progress) {
			t.Errorf("progress lacks /%s/:\n%s", re, progress)
		}
	}
	loc, err := chromedp.Run(tctx, chromedp.Location())
	if err != nil || !strings.Contains(loc, "/profiles?switch=") {
		t.Errorf("address after the switch: %q (%v)", loc, err)
	}
	pill, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#phase")))
	if err != nil || !strings.Contains(pill, "llama") {
		t.Errorf("state pill %q (%v)", pill, err)
	}
	if st := ev.f.Sup.State(); st.Profile != "llama" {
		t.Errorf("the daemon's state is %+v, not llama", st)
	}
	if !shots {
		return
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveArtifact(t, "panel-switch.png", shot)

	for _, pg := range []struct{ link, wait, file string }{
		{`nav a[href="/"]`, "svg.bar .bar-fg", "panel-dashboard.png"},
		{`nav a[href="/doctor"]`, "table.checks", "panel-doctor.png"},
	} {
		if err := chromedp.Do(tctx,
			chromedp.Click(chromedp.CSS(pg.link)),
			chromedp.WaitVisible(chromedp.CSS(pg.wait)),
		); err != nil {
			t.Fatalf("%s: %v", pg.file, err)
		}
		shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		saveArtifact(t, pg.file, shot)
	}
}
