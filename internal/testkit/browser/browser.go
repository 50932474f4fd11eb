// Package browser starts the headless Chromium that browser tests drive
// (chromedp). It is imported by tests only: the panel's pages, and the
// cross-origin attacks on the backends that must fail.
package browser

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/chromedp/chromedp"
)

// ChromiumPath is Debian's chromium, which CI installs.
const ChromiumPath = "/usr/bin/chromium"

// Start starts headless Chromium with a fresh profile and returns its
// chromedp context (ended by t.Cleanup), or skips t (loudly) when Chromium
// is not installed and GPUHOST_REQUIRE_BROWSER is not 1, which makes that a
// failure instead.
func Start(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(ChromiumPath); err != nil {
		msg := fmt.Sprintf("BROWSER TEST NOT RUN: %s is missing (%v); install Debian's chromium to run the browser tests", ChromiumPath, err)
		if os.Getenv("GPUHOST_REQUIRE_BROWSER") == "1" {
			t.Fatal(msg + " — GPUHOST_REQUIRE_BROWSER=1 makes this a failure")
		}
		t.Skip(msg)
	}
	profile := t.TempDir()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(ChromiumPath),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancelCtx := chromedp.NewContext(actx)
	// Cleanups run last-in first-out: the browser ends before its profile
	// directory is removed.
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // start the browser now
		t.Fatalf("start %s: %v", ChromiumPath, err)
	}
	return ctx
}
