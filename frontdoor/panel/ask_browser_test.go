package panel

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"gopkg.in/yaml.v3"

	"gpuhost/agent"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/internal/atomicfile"
	"gpuhost/internal/mcpview"
	"gpuhost/mcp"
	_ "gpuhost/mcp/connectors/calc"
	_ "gpuhost/mcp/connectors/gpu"
)

// askScreenshot is the file name of the Ask timeline screenshot.
const askScreenshot = "gpuhost-ask-timeline.png"

// saveAskScreenshot writes the timeline screenshot to os.TempDir() (a
// fixed, well-known path for the closing note), to
// $GPUHOST_SCREENSHOT_DIR when set, and to the artifact directory with the
// other panel screenshots; every path goes to the test log.
func saveAskScreenshot(t *testing.T, png []byte) {
	t.Helper()
	dirs := []string{os.TempDir()}
	if d := os.Getenv("GPUHOST_SCREENSHOT_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("create $GPUHOST_SCREENSHOT_DIR %s: %v", d, err)
		}
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		path := filepath.Join(d, askScreenshot)
		if err := atomicfile.Write(path, png, 0o644); err != nil {
			t.Fatalf("write screenshot %s: %v", path, err)
		}
		t.Logf("Ask timeline screenshot: %s", path)
	}
	saveArtifact(t, "panel-ask.png", png)
}

// TestBrowserAsk asks a question on the Ask page in headless Chromium
// through the real agent loop (the simulator's scripted tool use and the
// real in-process MCP client): the timeline arrives live over the stream,
// the failed first call ("6 x 7") is marked, the next step is the recovery
// whose corrected call ("6 * 7") succeeds, the answer quotes its result,
// and nothing from the loop turns into markup.
func TestBrowserAsk(t *testing.T) {
	ctx := newBrowser(t)
	// The coder backend is the real simulator in its scripted tool-use
	// mode (`--scripted-tools`), started by the real Supervisor.
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.Backends.VLLM.Exec = append(c.Backends.VLLM.Exec, "--scripted-tools")
	}}})
	asker := realAsker(t, ev)
	question, wantAnswer := browserQuestion, `"result": 42`
	ev.p.SetAsker(asker)
	cons := watchConsole(ctx)
	tctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()

	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/"),
		chromedp.WaitReady(chromedp.CSS(`html[data-js="ready"]`)),
		chromedp.Click(chromedp.CSS(`nav a[href="/ask"]`)),
		chromedp.WaitReady(chromedp.CSS(`ol#timeline[data-js="ready"]`)),
		chromedp.Evaluate[chromedp.Void](`window.__gpuhostNoReload = true`),
		chromedp.SendKeys(chromedp.CSS(`#question`), question),
		chromedp.Click(chromedp.CSS(`#ask-submit`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li.ev-answer`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li.ev-stop`)),
		chromedp.WaitReady(chromedp.CSS(`ol#timeline[data-state="done"]`)),
	); err != nil {
		html, _ := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("ask in the browser: %v (console: %v)\n%s", err, cons.errors(), html)
	}
	noReload, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.__gpuhostNoReload === true`))
	if err != nil || !noReload {
		t.Fatalf("the page reloaded (marker %v, %v): the timeline did not come from the stream", noReload, err)
	}
	timeline, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#timeline")))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timeline:\n%s", timeline)

	// Everything below reads the finished page at once (no waiting on
	// selectors that may rightly be absent).
	got, err := chromedp.Run(tctx, chromedp.Evaluate[askFacts](`(() => {
		const q = (s) => document.querySelector(s);
		const text = (s) => { const e = q(s); return e ? e.textContent : ''; };
		const f = q('#timeline li.ev-tool_result.failed');
		const r = q('#timeline li.recovery');
		return {
			failed: text('#timeline li.ev-tool_result.failed .ev-failed'),
			failedStep: f ? Number(f.dataset.step) : -1,
			recoveryStep: r ? Number(r.dataset.step) : -1,
			recoveryLabel: text('#timeline li.recovery .ev-recovery'),
			answer: text('#timeline li.ev-answer .ev-text'),
			stop: text('#timeline li.ev-stop'),
			status: text('#ask-status'),
			injected: document.querySelectorAll('#timeline script, #timeline img, #timeline b').length,
		};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Failed != "failed" {
		t.Errorf("the failed call is not marked: %+v", got)
	}
	if got.FailedStep < 1 || got.RecoveryStep != got.FailedStep+1 || got.RecoveryLabel != "recovery" {
		t.Errorf("failed step %d, recovery step %d labelled %q; want n, n+1, \"recovery\"", got.FailedStep, got.RecoveryStep, got.RecoveryLabel)
	}
	if !strings.Contains(got.Answer, wantAnswer) {
		t.Errorf("answer %q, want it to contain %q", got.Answer, wantAnswer)
	}
	if !strings.Contains(got.Stop, "answered") {
		t.Errorf("stop row %q", got.Stop)
	}
	if !strings.Contains(got.Status, "failed") {
		t.Errorf("status line %q, want the failed calls counted", got.Status)
	}
	if got.Injected != 0 {
		t.Errorf("%d elements from the loop's strings became markup", got.Injected)
	}
	shot, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveAskScreenshot(t, shot)
	if errs := cons.errors(); len(errs) > 0 {
		t.Errorf("browser console errors: %q", errs)
	}
}

// askFacts is what the browser test reads off the finished Ask page.
type askFacts struct {
	Failed        string `json:"failed"`
	FailedStep    int    `json:"failedStep"`
	RecoveryStep  int    `json:"recoveryStep"`
	RecoveryLabel string `json:"recoveryLabel"`
	Answer        string `json:"answer"`
	Stop          string `json:"stop"`
	Status        string `json:"status"`
	Injected      int    `json:"injected"`
}

// browserQuestion makes the scripted model call calc_evaluate with the
// quoted text, which is not arithmetic: the first call fails, the error
// goes back to the model, and the next step is its retry.
const browserQuestion = `Evaluate "6 x 7" with calc`

// realAsker is the real agent loop: tools from mcp.NewServer's gpu and calc
// connectors over the real in-process MCP client, the model the fixture's
// active coder backend, behind the Limiter the daemon shares.
func realAsker(t *testing.T, ev *env) Asker {
	t.Helper()
	on := yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	ms, err := mcp.NewServer(mcp.ServerOptions{
		Config:  map[string]yaml.Node{"gpu": on, "calc": on},
		Log:     ev.f.Log,
		Version: "test",
		Daemon:  &mcpview.Daemon{Sup: ev.f.Sup, DoctorFn: ev.f.Doctor},
	})
	if err != nil {
		t.Fatalf("MCP server: %v", err)
	}
	if d := ms.Disabled(); len(d) != 0 {
		t.Fatalf("connectors disabled: %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := ms.InProcessClient(ctx)
	if err != nil {
		t.Fatalf("in-process MCP client: %v", err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	base := fmt.Sprintf("http://127.0.0.1:%d/v1", ev.f.Cfg.Profiles["coder"].Port)
	return agent.NewLimiter(agent.New(cl, agent.Options{BaseURL: base, Log: ev.f.Log}), agent.DefaultMaxConcurrent)
}
