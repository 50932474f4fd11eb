package panel

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
)

// attackPage is served from another loopback origin and tries every way a
// web page can send requests to the daemon without its user's consent:
// no-cors and cors fetches of the JSON API, a text/plain form post shaped
// like JSON, a POST to the panel's own form route, and an <img> GET.
const attackPage = `<!doctype html><html><body>
<img id="img" src="%[1]s/api/switch?profile=llama">
<iframe name="sink" id="sink"></iframe>
<form id="f" method="POST" action="%[1]s/api/switch" enctype="text/plain" target="sink">
<input name='{"profile":"llama","x":"' value='"}'></form>
<script>
const T = %[1]q;
const body = JSON.stringify({profile: "llama"});
const tries = [
  fetch(T + "/api/switch", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body}),
  fetch(T + "/api/switch", {method: "POST", mode: "no-cors", body}),
  fetch(T + "/api/switch", {method: "POST", mode: "cors", headers: {"Content-Type": "application/json"}, body}),
  fetch(T + "/api/ask", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: JSON.stringify({question: "status?"})}),
  fetch(T + "/api/bench", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: "{}"}),
  fetch(T + "/switch", {method: "POST", mode: "no-cors", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "profile=llama&force=1"}),
  fetch(T + "/v1/chat/completions", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: JSON.stringify({model: "llama3.1:8b", messages: [{role: "user", content: "hi"}]})}),
];
const sunk = new Promise(r => document.getElementById("sink").addEventListener("load", r, {once: true}));
document.getElementById("f").submit();
Promise.allSettled(tries).then(rs => sunk.then(() => {
  window.__results = rs.map(r => r.status + ":" + (r.value ? r.value.type + "/" + r.value.status : String(r.reason)));
  window.__done = true;
}));
</script></body></html>`

// TestBrowserCrossOriginRefused opens a page from another loopback origin
// in headless Chromium and lets it try to drive the daemon: the profile
// never changes, no switch, question or benchmark starts, and every attempt
// reached the daemon and was refused there (counted at the guard).
func TestBrowserCrossOriginRefused(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	// Count what reaches the daemon, to show the attempts were made.
	var reached []string
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	inner := ev.srv.Config.Handler
	ev.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-mu
		reached = append(reached, r.Method+" "+r.URL.Path)
		mu <- struct{}{}
		inner.ServeHTTP(w, r)
	})
	before := ev.f.Sup.LastSeq()
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, attackPage, ev.srv.URL)
	}))
	defer attacker.Close()

	ctx := newBrowser(t)
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(attacker.URL+"/"),
		chromedp.Poll[chromedp.Void](`window.__done === true`, chromedp.WithPollingTimeout(30*time.Second)),
	); err != nil {
		t.Fatalf("attack page: %v", err)
	}
	results, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`window.__results`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fetch results in the page: %q", results)

	<-mu
	got := append([]string(nil), reached...)
	mu <- struct{}{}
	t.Logf("requests that reached the daemon: %q", got)
	for _, want := range []string{"GET /api/switch", "POST /api/switch", "POST /api/ask", "POST /api/bench", "POST /switch", "POST /v1/chat/completions"} {
		if !containsStr(got, want) {
			t.Errorf("%s never reached the daemon: the test proves nothing for it", want)
		}
	}
	st := ev.f.Sup.State()
	if st.Phase != api.PhaseActive || st.Profile != "coder" {
		t.Errorf("state after the attack: %+v, want coder active", st)
	}
	_, backlog, stop := ev.f.Sup.Subscribe(before)
	stop()
	for _, e := range backlog {
		if e.Kind == "switch" || e.Kind == "bench" || e.SwitchID != "" {
			t.Errorf("the attack started something: %+v", e)
		}
	}
	// The panel itself still works in the same browser.
	if err := chromedp.Do(tctx,
		chromedp.Navigate(ev.srv.URL+"/profiles"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-profile="llama"] button`)),
	); err != nil {
		t.Fatalf("panel after the attack: %v", err)
	}
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}
