package appliance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gpuhost/api"
	"gpuhost/internal/testkit/browser"
	"gpuhost/units"
)

// attack is one request of an attack page: a no-cors POST (no preflight;
// the page cannot read the answer, but its effect happens) or, with CORS,
// any method and a JSON body, which a backend that allows the page's
// origin (the real Ollama allows every http://127.0.0.1:* origin) answers.
type attack struct {
	Method, URL string
	CORS        bool
}

// attackPage is a web page that tries to change the backends' state the
// way any site could. The body names the real-Ollama test's model; Ollama
// and vLLM parse it as JSON whatever the Content-Type. The page writes
// "done" and each request's outcome (fulfilled: the backend answered;
// rejected: a network or CORS error) into its title.
func attackPage(attacks []attack) string {
	js, err := json.Marshal(attacks)
	if err != nil {
		panic(err) // plain strings and a bool always marshal
	}
	return `<!doctype html><title>running</title><script>
const body = '{"model":"tiny","name":"tiny"}';
Promise.allSettled(` + string(js) + `.map(a => fetch(a.URL, a.CORS
    ? {method: a.Method, mode: "cors", body: body, headers: {"Content-Type": "application/json"}}
    : {method: a.Method, mode: "no-cors", body: body})))
  .then(rs => { document.title = "done " + rs.map(r => r.status).join(","); });
</script>`
}

// runAttack loads url in the browser and returns the page's outcomes once
// every request settled.
func runAttack(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open attack page %s: %v", url, err)
	}
	title, err := chromedp.Run(ctx, chromedp.Poll[string](`document.title.startsWith("done") ? document.title : ""`,
		chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil {
		t.Fatalf("attack page %s did not finish: %v", url, err)
	}
	return strings.TrimPrefix(title, "done ")
}

// TestBrowserCannotDriveBackends: with gpuhost deployed as installed
// (private systemd, vLLM active with sleep mode, so its development
// endpoints are on), a page on another loopback origin and a file:// page
// in headless Chromium try to put vLLM to sleep and call /collective_rpc
// on its port (which worked before the backends got their own network). Every request must fail at the network
// (the port is in the backend's private network), vLLM must still be
// awake (asked through its socket) and /v1 through gpuhost must still
// answer. On 119e2ce the page reached /sleep and /v1 answered 503
// ModelSleepingError while gpuhost said "active".
func TestBrowserCannotDriveBackends(t *testing.T) {
	bctx := browser.Start(t)
	e := startE2EWith(t, "100ms", t.TempDir(), standbyE2EYAML, nil)
	e.switchTo(t, "coder")
	coder := e.cfg.Profiles["coder"]
	base := fmt.Sprintf("http://127.0.0.1:%d", coder.Port)
	page := attackPage([]attack{{"POST", base + "/sleep?level=1", false}, {"POST", base + "/collective_rpc", false}, {"POST", base + "/reset_prefix_cache", false}})

	for _, url := range attackPages(t, page) {
		got := runAttack(t, bctx, url)
		t.Logf("page %s: %s", url, got)
		if got != "rejected,rejected,rejected" {
			t.Errorf("page %s reached the backend: outcomes %q, want every request rejected", url, got)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sock := units.ProxySocketPath(e.cfg.Backends.VLLM.Unit, coder.Port)
	out, err := e.sd.Command(ctx, "curl", "-sS", "--max-time", "10", "--unix-socket", sock, "http://localhost/is_sleeping").CombinedOutput()
	if err != nil || !strings.Contains(strings.ReplaceAll(string(out), " ", ""), `"is_sleeping":false`) {
		t.Errorf("vLLM's /is_sleeping through %s after the pages: %v %s, want awake", sock, err, out)
	}
	e.backendOnlyThroughGpuhost(t, "coder")
	st, err := e.client.Status(ctx)
	if err != nil || st.State.Phase != api.PhaseActive || st.State.Profile != "coder" {
		t.Errorf("status after the pages: %+v %v", st.State, err)
	}
}

// attackPages serves page from another loopback origin and writes it as a
// file, and returns both addresses: the two places a hostile page on the
// box comes from. The server stops when the test ends.
func attackPages(t *testing.T, page string) []string {
	t.Helper()
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, page)
	}))
	t.Cleanup(site.Close)
	file := filepath.Join(t.TempDir(), "attack.html")
	if err := os.WriteFile(file, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{site.URL + "/", "file://" + file}
}
