package panel

import (
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	"gpuhost/bench/benchapi"
	"gpuhost/frontdoor/httpapi"
)

type benchSrc struct {
	*benchapi.Service
	store *bench.Store
}

func (b benchSrc) List() ([]*bench.Result, []bench.Warning, error) { return b.store.List() }

// TestBenchPage: stored runs are listed with their driver and figures, the
// chart is embedded, a corrupt file is named, and the run button is a
// CSRF-checked form that answers with the service's refusal when nothing
// is active.
func TestBenchPage(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{})
	api, err := httpapi.New(f.Sup, f.Doctor, f.Log)
	if err != nil {
		t.Fatal(err)
	}
	store := bench.NewStore(f.Cfg.StateDir, f.Log)
	data, err := os.ReadFile("../../bench/testdata/result-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	res, err := bench.ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Save(res); err != nil {
		t.Fatal(err)
	}
	data, err = os.ReadFile("../../bench/testdata/switch-result-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	sw, err := bench.ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	const why = "llama.service not in standby (holds 6200 MiB in standby, above its measured residual 500 MiB (+256)); it will be stopped"
	sw.Switch.Outliers = []bench.SwitchOutlier{{Round: 2, From: "coder", To: "llama", Path: bench.PathSwitch, Mode: bench.ModeStandby,
		FirstTokenMS: 20300, MedianMS: 250, Step: "standby", StepMS: 20010, StepMedianMS: 20, Message: why}}
	if _, err := store.Save(sw); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Cfg.StateDir+"/bench/broken-run.json", []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	svc := benchapi.NewService(benchapi.ServiceOptions{
		Store:  store,
		Daemon: benchapi.DaemonFuncs{SwitchingFunc: func() bool { return false }, AwaitActiveFunc: f.Sup.AwaitActive},
		Log:    f.Log,
	})
	defer svc.Close()
	svc.Register(api)
	p, err := New(f.Sup, f.Doctor, testDaemon(f.Cfg), f.Log)
	if err != nil {
		t.Fatal(err)
	}
	p.SetBench(benchSrc{svc, store})
	p.Register(api)
	srv := httptest.NewServer(api)
	defer srv.Close()
	ev := &env{f: f, p: p, srv: srv}
	c := ev.client(t)

	resp, body := do(t, c, "GET", srv.URL+"/bench", nil, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /bench: %d", resp.StatusCode)
	}
	for _, w := range []string{res.ID, `src="/api/bench/chart.svg"`, "broken-run.json", res.Fingerprint.Driver} {
		if !strings.Contains(body, w) {
			t.Errorf("bench page lacks %q", w)
		}
	}
	// The switch result has its own table: one row per direction, path
	// and mode, with p50 / p95 of the first token and of the switch.
	g := sw.Switch.Groups[0]
	firstRow := fmt.Sprintf("<td>%.0f / %.0f</td>", g.FirstTokenMS.P50, g.FirstTokenMS.P95)
	for _, w := range []string{"<h3>Switches</h3>", "<code>" + sw.ID + "</code>", "<td>coder → llama</td>", "<td>request</td>", "<td>cold</td>", firstRow} {
		if !strings.Contains(body, w) {
			t.Errorf("bench page lacks %q", w)
		}
	}
	if n := strings.Count(body, "<code>"+sw.ID+"</code>"); n != 2 {
		t.Errorf("the switch result shows %d times, want twice (its rows and its outlier; not among the tok/s runs)", n)
	}
	// An outlier names its round and why, from the step's message.
	outlier := "round 2 coder → llama, switch path (standby): <strong>20300 ms</strong>, median 250 ms. <span class=\"outlier-why\">step standby took 20010 ms (median 20.00 ms): " + why
	if !strings.Contains(html.UnescapeString(body), outlier) {
		t.Errorf("bench page lacks the outlier %q", outlier)
	}
	if n := strings.Count(body, "<td>llama → coder</td>"); n != 2 {
		t.Errorf("%d llama → coder rows, want 2 (switch and request path)", n)
	}
	resp, svg := do(t, c, "GET", srv.URL+"/api/bench/chart.svg", nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(svg, "<svg") {
		t.Errorf("chart: %d", resp.StatusCode)
	}

	// Without the CSRF token: refused, nothing started.
	resp, _ = do(t, c, "POST", srv.URL+"/bench/run", url.Values{}, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST /bench/run without CSRF: %d, want 403", resp.StatusCode)
	}
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token in the bench page")
	}
	resp, body = do(t, c, "POST", srv.URL+"/bench/run", url.Values{"csrf": {m[1]}}, nil)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "Not started") {
		t.Errorf("POST /bench/run while idle: %d, want 409 with the reason", resp.StatusCode)
	}
	// The page's script asks for JSON: the refusal is an API error body.
	resp, body = do(t, c, "POST", srv.URL+"/bench/run", url.Values{"csrf": {m[1]}}, map[string]string{"Accept": "application/json"})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, `"detail":"Not started: `) {
		t.Errorf("POST /bench/run (JSON) while idle: %d %s, want 409 with the reason", resp.StatusCode, body)
	}
	if svc.Current() != nil {
		t.Error("a run started with no active backend")
	}
}
