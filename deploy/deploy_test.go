package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/frontdoor/metrics"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/apishape"
	"gpuhost/triage"
	"gpuhost/triage/llm"
	"gpuhost/triage/source"
	"gpuhost/units"
)

// fromPrometheus are series Prometheus itself writes for every target, not
// the daemon.
var fromPrometheus = map[string]bool{"up": true}

// exported returns the names of the series the daemon exports, as a scrape
// of a real /metrics shows them: a real Supervisor (after a switch, so the
// switch series exist) with the metrics served on echo, the proxy's and
// the triage worker's collectors added as serve does, the Telegram bot's
// status set, and one observed /v1 request. Vectors that have no series
// until something happens (the triage worker's mails by class, the proxy's
// refusals) are taken from their collectors' descriptions. Histograms and
// summaries contribute their _bucket, _sum and _count names.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	f.Sup.SetTelegramStatus(func() api.TelegramStatus {
		return api.TelegramStatus{State: api.TelegramPolling, Errors: map[string]uint64{"network": 1}}
	})
	m := metrics.New(f.Sup, f.Doctor, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	px := proxy.New(f.Sup, f.Cfg.Proxy, func() map[string]*units.Profile { return f.Cfg.Profiles }, slog.New(slog.DiscardHandler))
	t.Cleanup(px.Close)
	w := newTriageWorker(t)
	added := append(px.Collectors(), w.Collectors()...)
	if err := m.Add(added...); err != nil {
		t.Fatal(err)
	}
	m.ObserveRequest(apishape.Chat, "qwen3-coder", 200, 10, 20, 50*time.Millisecond, time.Second)
	m.ObserveRequestDetail("qwen3-coder", 10*time.Millisecond, true, 20, 50*time.Millisecond, time.Second)

	e := echo.New()
	m.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	names := map[string]bool{}
	// Run counts the switch from the Supervisor's events and runs the doctor
	// in the background: scrape until the switch and doctor series show up
	// (the doctor's first run includes the endpoint probes).
	deadline := time.Now().Add(90 * time.Second)
	for {
		clear(names)
		for name, mf := range scrape(t, srv.URL+"/metrics") {
			addFamily(names, name, mf.GetType().String())
		}
		if names["gpuhost_switch_step_duration_seconds_bucket"] && names["gpuhost_doctor_check_status"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{"gpuhost_switches_total", "gpuhost_active_profile_info", "DCGM_FI_DEV_FB_USED", "gpuhost_telegram_up"} {
		if !names[want] {
			t.Fatalf("the scrape lacks %s: %v", want, sorted(names))
		}
	}
	for _, c := range added {
		describe(t, names, c)
	}
	return names
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// addFamily adds a family's name and, for histograms and summaries, the
// names PromQL sees.
func addFamily(names map[string]bool, name, typ string) {
	names[name] = true
	switch typ {
	case "HISTOGRAM", "GAUGE_HISTOGRAM":
		names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
	case "SUMMARY":
		names[name+"_sum"], names[name+"_count"] = true, true
	}
}

// fqName reads the name out of a Desc's String (client_golang has no
// accessor for it).
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// describe adds the names c describes, with the histogram suffixes when c
// is a histogram.
func describe(t *testing.T, names map[string]bool, c prometheus.Collector) {
	t.Helper()
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	// A lone Histogram and Summary have the same method set, so only the
	// vectors can be told apart by type; a lone one would show in the
	// scrape anyway (it has its series from the start).
	typ := ""
	switch c.(type) {
	case *prometheus.HistogramVec:
		typ = "HISTOGRAM"
	case *prometheus.SummaryVec:
		typ = "SUMMARY"
	}
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no fqName in %s", d)
		}
		addFamily(names, m[1], typ)
	}
}

// newTriageWorker is a worker on an empty Maildir whose classifier is never
// called: only its collectors are used.
func newTriageWorker(t *testing.T) *triage.Worker {
	t.Helper()
	dir := t.TempDir()
	for _, sub := range []string{"cur", "new", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, "mail", sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	src, err := source.NewMaildir(filepath.Join(dir, "mail"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	cl, err := llm.NewClassifier(llm.ClassifierOptions{BaseURL: "http://127.0.0.1:1/v1", Model: "unused"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := triage.New(triage.Options{Source: src, Classifier: cl, StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// expr is one PromQL expression and where it came from.
type expr struct {
	where, text string
}

// ruleExprs reads the expressions of a Prometheus rule file, and the names
// it records.
func ruleExprs(t *testing.T, path string) (exprs []expr, recorded []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Record      string            `yaml:"record"`
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			name := r.Record + r.Alert
			if r.Expr == "" {
				t.Errorf("%s: rule %s has no expr", path, name)
			}
			if r.Alert != "" && strings.TrimSpace(r.Annotations["runbook"]) == "" {
				t.Errorf("%s: alert %s has no runbook annotation", path, r.Alert)
			}
			if r.Record != "" {
				recorded = append(recorded, r.Record)
			}
			exprs = append(exprs, expr{path + ": " + name, r.Expr})
		}
	}
	return exprs, recorded
}

// promql is the default parser: no experimental functions, the syntax a
// stock Prometheus accepts.
var promql = parser.NewParser(parser.Options{})

// grafanaVar is a Grafana template variable or macro in an expression.
var grafanaVar = regexp.MustCompile(`\$(\{[A-Za-z0-9_]+(:[A-Za-z]+)?\}|[A-Za-z0-9_]+)`)

// grafanaMacros are Grafana's time macros; each stands for a duration.
var grafanaMacros = map[string]bool{"__interval": true, "__rate_interval": true, "__range": true}

// substitute replaces Grafana's variables: time macros by a duration, the
// dashboard's own variables (which only ever appear in label matchers) by
// a regular expression.
func substitute(s string) string {
	return grafanaVar.ReplaceAllStringFunc(s, func(v string) string {
		name := strings.Trim(v, "${}")
		name, _, _ = strings.Cut(name, ":")
		if grafanaMacros[name] {
			return "5m"
		}
		return ".+"
	})
}

// labelValues is a Grafana variable query label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

// dashboardExprs walks the dashboard's JSON for every expression: panel
// targets, annotation queries and variable queries.
func dashboardExprs(t *testing.T, path string) []expr {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var root any
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []expr
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if title, ok := x["title"].(string); ok {
				where = path + ": " + title
			}
			if name, ok := x["name"].(string); ok && x["type"] == "query" {
				where = path + ": variable " + name
				if q, ok := x["query"].(map[string]any); ok {
					if s, ok := q["query"].(string); ok {
						m := labelValues.FindStringSubmatch(s)
						if m == nil {
							t.Errorf("%s: variable query %q is not label_values(SELECTOR, LABEL)", where, s)
						} else {
							out = append(out, expr{where, m[1]})
						}
					}
				}
			}
			for k, c := range x {
				if s, ok := c.(string); ok && k == "expr" {
					out = append(out, expr{where, s})
					continue
				}
				walk(where, c)
			}
		case []any:
			for _, c := range x {
				walk(where, c)
			}
		}
	}
	walk(path, root)
	return out
}

// TestEveryMetricIsExported parses every PromQL expression of the rules and
// the dashboard and checks that each metric it names is exported by the
// daemon (or recorded by the rules, or written by Prometheus itself).
func TestEveryMetricIsExported(t *testing.T) {
	names := exported(t)

	var exprs []expr
	known := map[string]bool{}
	for n := range names {
		known[n] = true
	}
	for n := range fromPrometheus {
		known[n] = true
	}
	for _, f := range []string{"prometheus/recording.rules.yml", "prometheus/alerts.rules.yml"} {
		es, rec := ruleExprs(t, f)
		exprs = append(exprs, es...)
		for _, r := range rec {
			known[r] = true
		}
	}
	dash := dashboardExprs(t, "grafana/gpuhost.json")
	if len(dash) < 20 {
		t.Fatalf("only %d expressions found in the dashboard", len(dash))
	}
	exprs = append(exprs, dash...)

	used := map[string]bool{}
	for _, e := range exprs {
		names, problems := check(e, known)
		for _, n := range names {
			used[n] = true
		}
		for _, p := range problems {
			t.Error(p)
		}
	}
	// The acceptance list: what the dashboard and the alerts are for.
	for _, want := range []string{
		"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
		"gpuhost_active_profile_info", "gpuhost_switches_total", "gpuhost_proxy_requests_total",
		"gpuhost_proxy_time_to_first_byte_seconds_bucket", "gpuhost_proxy_output_tokens_per_second_bucket",
		"gpuhost_switch_step_duration_seconds_bucket", "gpuhost_proxy_hold_seconds_bucket",
		"gpuhost_triage_mails_total", "gpuhost_triage_cost_total", "gpuhost_triage_consecutive_poll_failures",
		"gpuhost_doctor_check_status", "gpuhost_gpu_memory_held_bytes",
	} {
		if !used[want] {
			t.Errorf("no rule or panel uses %s", want)
		}
	}
}

// check parses one expression (Grafana variables substituted) and returns
// the metric names it selects and what is wrong with it: a parse error, a
// selector without a metric name, a name not in known, no selector at all.
func check(e expr, known map[string]bool) (names, problems []string) {
	ast, err := promql.ParseExpr(substitute(e.text))
	if err != nil {
		return nil, []string{fmt.Sprintf("%s: %q: %v", e.where, e.text, err)}
	}
	parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if vs.Name == "" {
			problems = append(problems, fmt.Sprintf("%s: a selector without a metric name: %s", e.where, vs))
			return nil
		}
		names = append(names, vs.Name)
		if !known[vs.Name] {
			problems = append(problems, fmt.Sprintf("%s: metric %s is not exported by the daemon", e.where, vs.Name))
		}
		return nil
	})
	if len(names) == 0 && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("%s: %q selects no series", e.where, e.text))
	}
	return names, problems
}

// TestCheckCatches: the check is not vacuous; a made-up name, a nameless
// selector, a broken expression and one without a selector are reported.
func TestCheckCatches(t *testing.T) {
	known := map[string]bool{"gpuhost_switches_total": true}
	tests := []struct {
		text, want string
	}{
		{`sum by (instance) (rate(gpuhost_switches_total{instance=~"$host"}[$__rate_interval]))`, ""},
		{`sum by (instance) (rate(gpuhost_made_up_total{instance=~"$host"}[$__rate_interval]))`, "gpuhost_made_up_total is not exported"},
		{`gpuhost_switches_total / on(instance) {__name__=~"gpuhost_.*"}`, "without a metric name"},
		{`rate(gpuhost_switches_total[5m]`, "unclosed"},
		{`vector(1)`, "selects no series"},
	}
	for _, tc := range tests {
		_, problems := check(expr{"test", tc.text}, known)
		got := strings.Join(problems, "; ")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: problems %q, want %q", tc.text, got, tc.want)
		}
	}
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
