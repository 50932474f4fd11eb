package panel

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/units"
)

// phoneWidth is the viewport of the phone walk (an iPhone 12–15's CSS
// width).
const phoneWidth = 390

// rect is an element's box as getBoundingClientRect reports it.
type rect struct {
	Left, Right, Top, Bottom float64
}

// doctorRow is one row of the Doctor table as the phone shows it.
type doctorRow struct {
	Severity string
	Text     string
	Msg, Fix rect
	HasFix   bool
	Codes    int // <code> elements in the message and fix
}

// checkDoctorPhone: on /doctor at 390 px every row shows its message and
// fix within the viewport, the fix below the message (stacked), the rows
// worst first (every fail before any warn before any ok), and no backtick
// as text. It returns the <code> elements in messages and fixes.
func checkDoctorPhone(t *testing.T, ctx context.Context, srvURL string) int {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.EmulateViewport(phoneWidth, 844),
		chromedp.Navigate(srvURL+"/doctor"),
		chromedp.WaitVisible(chromedp.CSS("table.checks.doctor tbody tr")),
	); err != nil {
		t.Fatalf("/doctor at %d px: %v", phoneWidth, err)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]doctorRow](`Array.from(document.querySelectorAll('table.checks.doctor tbody tr')).map((tr) => {
		const box = (el) => { const r = el.getBoundingClientRect(); return {Left: r.left, Right: r.right, Top: r.top, Bottom: r.bottom}; };
		const msg = tr.querySelector('td.msg'), fix = tr.querySelector('td.fix');
		return {Severity: tr.dataset.severity, Text: tr.textContent, Msg: box(msg), Fix: box(fix),
			HasFix: fix.textContent.trim() !== '', Codes: tr.querySelectorAll('td.msg code, td.fix code').length};
	})`))
	if err != nil || len(rows) < 3 {
		t.Fatalf("doctor rows at %d px: %d (%v)", phoneWidth, len(rows), err)
	}
	rank := map[string]int{"fail": 0, "warn": 1, "ok": 2}
	codes, fixes := 0, 0
	for i, r := range rows {
		if i > 0 && rank[r.Severity] < rank[rows[i-1].Severity] {
			t.Errorf("row %d (%s) comes after a %s row: not worst first", i, r.Severity, rows[i-1].Severity)
		}
		if strings.Contains(r.Text, "`") {
			t.Errorf("row %d shows a raw backtick: %q", i, strings.TrimSpace(r.Text))
		}
		if r.Msg.Left < 0 || r.Msg.Right > phoneWidth || r.Msg.Right-r.Msg.Left < phoneWidth/2 {
			t.Errorf("row %d: the message spans %.0f–%.0f px, want within 0–%d and at least half the width", i, r.Msg.Left, r.Msg.Right, phoneWidth)
		}
		if r.HasFix {
			fixes++
			if r.Fix.Left < 0 || r.Fix.Right > phoneWidth || r.Fix.Top < r.Msg.Bottom {
				t.Errorf("row %d: the fix at %+v is not within the viewport below the message %+v", i, r.Fix, r.Msg)
			}
		}
		codes += r.Codes
	}
	if rows[0].Severity != "fail" && rows[0].Severity != "warn" {
		t.Errorf("the first row is %s: the fixture's doctor reports a failure (coder-greedy) that must lead", rows[0].Severity)
	}
	if fixes == 0 {
		t.Errorf("no row has a fix: the stacking was not checked")
	}
	if w, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`document.querySelector('table.checks.doctor').scrollWidth - document.querySelector('table.checks.doctor').clientWidth`)); err != nil || w > 0 {
		t.Errorf("the doctor table scrolls sideways by %v px (%v)", w, err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err == nil {
		saveArtifact(t, "panel-doctor-390.png", shot)
	}
	checkDoctorIDsWhole(t, ctx, phoneWidth)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800), chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS("table.checks.doctor tbody tr"))); err != nil {
		t.Fatalf("/doctor at 1280 px: %v", err)
	}
	checkDoctorIDsWhole(t, ctx, 1280)
	return codes
}

// checkDoctorIDsWhole: every check id wraps, if at all, only between its
// parts (after a dot, before a bracket): each part's text lies on one line.
func checkDoctorIDsWhole(t *testing.T, ctx context.Context, width int) {
	t.Helper()
	broken, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		const out = [];
		for (const code of document.querySelectorAll('table.checks.doctor td.id code')) {
			for (const node of code.childNodes) {
				if (node.nodeType !== Node.TEXT_NODE || node.textContent === '') continue;
				const r = document.createRange(); r.selectNodeContents(node);
				const lines = new Set(Array.from(r.getClientRects()).map((b) => Math.round(b.top)));
				if (lines.size > 1) out.push(code.textContent + ' splits "' + node.textContent + '"');
			}
		}
		return out;
	})()`))
	if err != nil {
		t.Fatalf("check ids at %d px: %v", width, err)
	}
	for _, b := range broken {
		t.Errorf("at %d px a check id breaks mid-word: %s", width, b)
	}
}

// TestBrowserDoctorPhone walks the Doctor page at 390 px on a box
// without the NVIDIA driver (gpu.backend nvml where no libnvidia-ml
// loads: the real NVML loader fails), whose doctor fails gpu.* with fixes
// that name commands between backticks: those show as <code>, one per
// backtick pair of the doctor's own report, and the failures lead.
func TestBrowserDoctorPhone(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Hook: func(c *config.Config) { c.GPU.Backend = "nvml" }}})
	rep := ev.f.Doctor(context.Background(), "")
	pairs := 0
	for _, c := range rep.Checks {
		pairs += strings.Count(c.Message, "`")/2 + strings.Count(c.Fix, "`")/2
	}
	if pairs == 0 || rep.Worst != string(units.SeverityFail) {
		t.Fatalf("the doctor without NVML reports worst %s with %d backtick pairs; this machine may have a working NVML, and the test needs a failure that names a command", rep.Worst, pairs)
	}
	ctx := newBrowser(t)
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate(ev.srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	if codes := checkDoctorPhone(t, tctx, ev.srv.URL); codes != pairs {
		t.Errorf("%d <code> elements on the page, want %d (one per backtick pair in the report)", codes, pairs)
	}
}

// checkLogsPhone: on /logs at 390 px a long log line wraps: no journal
// box scrolls sideways and each lies within the viewport.
func checkLogsPhone(t *testing.T, ctx context.Context, srvURL, longLine string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.EmulateViewport(phoneWidth, 844),
		chromedp.Navigate(srvURL+"/logs"),
		chromedp.WaitVisible(chromedp.CSS("#tail")),
	); err != nil {
		t.Fatalf("/logs at %d px: %v", phoneWidth, err)
	}
	waitText(t, ctx, "#tail", longLine)
	type box struct {
		Right, ScrollW, ClientW float64
	}
	boxes, err := chromedp.Run(ctx, chromedp.Evaluate[[]box](`Array.from(document.querySelectorAll('pre.journal')).map((p) =>
		({Right: p.getBoundingClientRect().right, ScrollW: p.scrollWidth, ClientW: p.clientWidth}))`))
	if err != nil || len(boxes) == 0 {
		t.Fatalf("journal boxes: %v (%v)", boxes, err)
	}
	for i, b := range boxes {
		if b.Right > phoneWidth || b.ScrollW > b.ClientW {
			t.Errorf("journal box %d: right %.0f px, content %.0f px in %.0f px: the lines do not wrap", i, b.Right, b.ScrollW, b.ClientW)
		}
	}
}

// checkBenchPhone: on /bench at 390 px the stored-results chart fits its
// card and the viewport.
func checkBenchPhone(t *testing.T, ctx context.Context, srvURL string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.EmulateViewport(phoneWidth, 844),
		chromedp.Navigate(srvURL+"/bench"),
		chromedp.WaitVisible(chromedp.CSS("#bench-results img.chart")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#bench-results img.chart').complete && document.querySelector('#bench-results img.chart').naturalWidth > 0`, chromedp.WithPollingTimeout(30*time.Second)),
	); err != nil {
		t.Fatalf("/bench at %d px: %v", phoneWidth, err)
	}
	type fit struct {
		Img, Card rect
		Natural   float64
	}
	f, err := chromedp.Run(ctx, chromedp.Evaluate[fit](`(() => {
		const box = (el) => { const r = el.getBoundingClientRect(); return {Left: r.left, Right: r.right, Top: r.top, Bottom: r.bottom}; };
		const img = document.querySelector('#bench-results img.chart');
		return {Img: box(img), Card: box(img.closest('.card')), Natural: img.naturalWidth};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Natural <= phoneWidth {
		t.Fatalf("the chart is %.0f px wide by itself: the check would prove nothing", f.Natural)
	}
	if f.Img.Left < f.Card.Left || f.Img.Right > f.Card.Right || f.Card.Right > phoneWidth || f.Img.Right-f.Img.Left < 0.5*(f.Card.Right-f.Card.Left) {
		t.Errorf("the chart spans %.0f–%.0f px in its card %.0f–%.0f px (viewport %d)", f.Img.Left, f.Img.Right, f.Card.Left, f.Card.Right, phoneWidth)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err == nil {
		saveArtifact(t, "panel-bench-390.png", shot)
	}
}
