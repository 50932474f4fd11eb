package panel

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gpuhost/api"
	"gpuhost/internal/testkit"
)

// activeRows are the profiles the page marks active, in page order.
func activeRows(t *testing.T, ctx context.Context) []string {
	t.Helper()
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('tr.active[data-profile]')).map((tr) => tr.dataset.profile)`))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestBrowserLanes walks a real box of three lanes (GPU 0, GPU 1, GPU
// 0+1) in headless Chromium. A switch on GPU 1 from the panel, while
// another client switches GPU 0, is followed to its end by its own events
// only (the live steps are the server's view of that switch id), leaves
// GPU 0's profile marked active, starts "VRAM released" from GPU 1's
// memory and brings the pill to both lanes. A switch on GPU 0+1 clears
// the marks of GPU 0 and GPU 1. The dashboard's GPU cards say what each
// lane serves and follow a switch made elsewhere.
func TestBrowserLanes(t *testing.T) {
	ev := laneBoxEnv(t, "coder", "llama")
	ctx := newBrowser(t)
	cons := watchConsole(ctx)
	tctx, cancel := context.WithTimeout(ctx, 150*time.Second)
	defer cancel()
	fail := func(what string, err error) {
		t.Helper()
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("%s: %v (console: %v)\n%s", what, err, cons.errors(), html)
	}

	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/profiles"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-profile="llama2"] button`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		fail("profiles", err)
	}
	if got := activeRows(t, tctx); !slices.Equal(got, []string{"coder", "llama"}) {
		t.Errorf("active rows %v, want coder and llama", got)
	}

	// Another client switches GPU 0 (a 3 s load) while the panel switches
	// GPU 1: two switches on disjoint lanes at once.
	_, gpu0Done, err := ev.box.Switch(context.Background(), "coder-slow", api.SwitchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(tctx,
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostNoReload = true`),
		chromedp.Click(chromedp.CSS(`tr[data-profile="llama2"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`#progress.outcome-done`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.active[data-profile="llama2"]`)),
	); err != nil {
		fail("switch on GPU 1", err)
	}
	if st := laneState(t, ev.box, "GPU 0"); st.Phase != api.PhaseSwitching {
		t.Logf("GPU 0's switch was no longer running when GPU 1's ended (%s): the load hid the overlap", api.LaneLine(st))
	}
	if got := activeRows(t, tctx); !slices.Equal(got, []string{"coder", "llama2"}) {
		t.Errorf("after the switch on GPU 1 the active rows are %v, want coder (GPU 0, untouched) and llama2", got)
	}
	id, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector('#progress').dataset.switchId`))
	if err != nil || id == "" {
		t.Fatalf("progress switch id %q (%v)", id, err)
	}
	labels, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#progress .steps li .label')).map((l) => l.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	_, backlog, unsub := ev.box.Subscribe(0)
	unsub()
	var want []string
	for _, s := range buildProgress(id, backlog, ev.p.befores.get(id), ev.box.State()).Steps {
		want = append(want, s.Label)
	}
	if !slices.Equal(labels, want) {
		t.Errorf("live steps %q, want the server's view of switch %s %q", labels, id, want)
	}
	progress, _ := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#progress")))
	for _, re := range []string{`Switch to llama2`, `VRAM released 6\.\d → 0\.\d GiB`, `llama2 is active`} {
		if !regexp.MustCompile(re).MatchString(progress) {
			t.Errorf("progress lacks /%s/:\n%s", re, progress)
		}
	}
	waitText(t, tctx, `#phase`, "GPU 1: llama2 · ollama")
	select {
	case err := <-gpu0Done:
		if err != nil {
			t.Fatalf("GPU 0's switch to coder-slow: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("GPU 0's switch to coder-slow did not end")
	}
	if shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)); err == nil {
		saveArtifact(t, "panel-lanes-switch-gpu1.png", shot)
	}

	// A switch on GPU 0+1 takes both GPUs: both lanes' marks go.
	if err := chromedp.Do(tctx,
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(`tr.active[data-profile="coder-slow"]`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostNoReload = true`),
		chromedp.Click(chromedp.CSS(`tr[data-profile="coder-tp"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`#progress.outcome-done`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.active[data-profile="coder-tp"]`)),
	); err != nil {
		fail("switch on GPU 0+1", err)
	}
	if got := activeRows(t, tctx); !slices.Equal(got, []string{"coder-tp"}) {
		t.Errorf("after the switch on GPU 0+1 the active rows are %v, want coder-tp alone", got)
	}
	if ok, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`)); err != nil || !ok {
		t.Errorf("the page reloaded during the switch (%v): the marks did not come from the script", err)
	}

	// The dashboard: each GPU's card names the lanes on it.
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#gpu-1 dd.serving`)),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
	); err != nil {
		fail("dashboard", err)
	}
	lanesOn := func(gpu string) string {
		t.Helper()
		lines, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#`+gpu+` dd.serving .lane-line')).map((l) => l.className + ' ' + l.textContent)`))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "; ")
	}
	for gpu, want := range map[string]string{
		"gpu-0": "lane-line lane-idle GPU 0: idle; lane-line lane-active GPU 0+1: active: coder-tp (vllm)",
		"gpu-1": "lane-line lane-idle GPU 1: idle; lane-line lane-active GPU 0+1: active: coder-tp (vllm)",
	} {
		if got := lanesOn(gpu); got != want {
			t.Errorf("%s serves %q, want %q", gpu, got, want)
		}
	}
	// The Backend card is GPU 0's lane's, which serves nothing now.
	if backend, err := chromedp.Run(tctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll('section.card')).find((s) => s.querySelector('h2').textContent.startsWith('Backend')).textContent`)); err != nil ||
		!strings.Contains(backend, "no backend runs") || strings.Contains(backend, "coder-tp") {
		t.Errorf("Backend card %q (%v): want GPU 0's idle lane, not GPU 0+1's profile", strings.Join(strings.Fields(backend), " "), err)
	}
	if shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)); err == nil {
		saveArtifact(t, "panel-lanes-box-dashboard.png", shot)
	}
	// A switch made elsewhere (GPU 1 takes its GPU back from GPU 0+1)
	// reaches the open dashboard.
	boxSwitch(t, ev.box, "llama")
	want1 := "lane-line lane-active GPU 1: active: llama (ollama); lane-line lane-idle GPU 0+1: idle"
	if !testkit.Poll(20*time.Second, func() bool { return lanesOn("gpu-1") == want1 }) {
		t.Errorf("the dashboard did not follow GPU 1's switch: %q, want %q", lanesOn("gpu-1"), want1)
	}
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}
