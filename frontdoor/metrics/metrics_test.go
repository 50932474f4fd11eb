package metrics

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/apishape"
	"gpuhost/nvml"
	"gpuhost/units"
)

// served is a Metrics running against a fixture and served over real HTTP.
type served struct {
	f   *appliancetest.Fixture
	m   *Metrics
	url string
}

// serve starts Metrics for f; tune may change it before Run.
func serve(t *testing.T, f *appliancetest.Fixture, tune ...func(*Metrics)) *served {
	t.Helper()
	m := New(f.Sup, f.Doctor, f.Log)
	for _, fn := range tune {
		fn(m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	e := echo.New()
	m.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return &served{f: f, m: m, url: srv.URL + "/metrics"}
}

// caughtUp waits until the metrics have handled every event the Supervisor
// has published so far.
func (s *served) caughtUp(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seq := s.f.Sup.LastSeq()
	if err := s.m.waitFor(ctx, func() bool { return s.m.lastSeq >= seq }); err != nil {
		t.Fatalf("metrics did not handle event %d: %v", seq, err)
	}
}

// scrape GETs /metrics and parses the text exposition.
func (s *served) scrape(t *testing.T) families {
	t.Helper()
	resp, err := http.Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	return fams
}

type families map[string]*dto.MetricFamily

// find returns the series of family name whose labels include want.
func (fs families) find(name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	fam, ok := fs[name]
	if !ok {
		return nil
	}
	for _, m := range fam.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		match := true
		for k, v := range want {
			if have[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// one returns the single series of name matching want.
func (fs families) one(t *testing.T, name string, want map[string]string) *dto.Metric {
	t.Helper()
	ms := fs.find(name, want)
	if len(ms) != 1 {
		t.Fatalf("%s%v: %d series, want 1 (family has %d)", name, want, len(ms), len(fs[name].GetMetric()))
	}
	return ms[0]
}

// value is the gauge, counter or untyped value of the single matching series.
func (fs families) value(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	m := fs.one(t, name, want)
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetUntyped().GetValue()
}

// count is the sample count of the single matching histogram series, 0 when
// there is none (a histogram vector shows no series before its first
// observation).
func (fs families) count(t *testing.T, name string, want map[string]string) uint64 {
	t.Helper()
	ms := fs.find(name, want)
	switch len(ms) {
	case 0:
		return 0
	case 1:
		return ms[0].GetHistogram().GetSampleCount()
	}
	t.Fatalf("%s%v: %d series, want at most 1", name, want, len(ms))
	return 0
}

func TestGPUSeriesMatchDCGMExporterAndSnapshot(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	s := serve(t, f)
	fams := s.scrape(t)
	snap, err := f.Sup.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d, ok := snap.Device0()
	if !ok {
		t.Fatal("snapshot has no GPU")
	}
	host, _ := os.Hostname()
	labels := map[string]string{"gpu": "0", "UUID": nvml.SimUUID, "device": "nvidia0", "modelName": nvml.DefaultSimName, "Hostname": host}

	if got := fams.value(t, "gpuhost_gpu_up", nil); got != 1 {
		t.Errorf("gpuhost_gpu_up = %v, want 1", got)
	}
	// The coder profile holds 0.92 of the card, so the value is not a
	// coincidence of an idle GPU.
	if d.MemoryUsedMiB < 20000 {
		t.Fatalf("snapshot used %d MiB after the switch to coder, want ≈ 22616", d.MemoryUsedMiB)
	}
	tests := []struct {
		name, help string
		want       float64
	}{
		{"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", float64(d.MemoryUsedMiB)},
		{"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", float64(d.MemoryFreeMiB)},
		{"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", float64(d.UtilizationGPU)},
		{"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", float64(d.UtilizationMemory)},
		{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", float64(d.TemperatureC)},
		{"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", d.PowerW},
		{"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", float64(d.SMClockMHz)},
		{"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", float64(d.MemClockMHz)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fam := fams[tc.name]
			if fam == nil {
				t.Fatalf("no %s in the scrape", tc.name)
			}
			if fam.GetType() != dto.MetricType_GAUGE {
				t.Errorf("type %v, want gauge", fam.GetType())
			}
			if fam.GetHelp() != tc.help {
				t.Errorf("HELP %q, want dcgm-exporter's %q", fam.GetHelp(), tc.help)
			}
			if got := fams.value(t, tc.name, labels); got != tc.want {
				t.Errorf("%s = %v, want the snapshot's %v", tc.name, got, tc.want)
			}
			m := fams.one(t, tc.name, labels)
			if n := len(m.GetLabel()); n != len(dcgmLabels) {
				t.Errorf("%d labels %v, want exactly %v", n, m.GetLabel(), dcgmLabels)
			}
		})
	}
}

func TestSwitchesProfileStateAndUnits(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	s := serve(t, f)
	vllmUnit, ollamaUnit := f.Cfg.Backends.VLLM.Unit, f.Cfg.Backends.Ollama.Unit

	// The switch to coder happened before the metrics started: it is
	// counted from the Supervisor's event buffer.
	s.caughtUp(t)
	fams := s.scrape(t)
	coderDone := map[string]string{"profile": "coder", "result": "done"}
	if got := fams.value(t, "gpuhost_switches_total", coderDone); got != 1 {
		t.Errorf("switches_total%v = %v, want 1", coderDone, got)
	}
	if got := fams.count(t, "gpuhost_switch_duration_seconds", coderDone); got != 1 {
		t.Errorf("switch_duration_seconds%v count = %d, want 1", coderDone, got)
	}
	fams.value(t, "gpuhost_active_profile_info", map[string]string{
		"profile": "coder", "backend": "vllm", "unit": vllmUnit, "served_name": "qwen3-coder"})
	for _, step := range []string{"vram_release", "configure", "start", "ready", "verify"} {
		if got := fams.count(t, "gpuhost_switch_step_duration_seconds", map[string]string{"step": step}); got != 1 {
			t.Errorf("step %s observed %d times, want 1", step, got)
		}
	}

	if _, err := f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	s.caughtUp(t)
	fams = s.scrape(t)

	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gpuhost_switches_total", coderDone, 1},
		{"gpuhost_switches_total", map[string]string{"profile": "llama", "result": "done"}, 1},
		{"gpuhost_active_profile_info", map[string]string{"profile": "llama", "backend": "ollama", "unit": ollamaUnit, "served_name": "llama3.1:8b"}, 1},
		{"gpuhost_state", map[string]string{"phase": "active"}, 1},
		{"gpuhost_state", map[string]string{"phase": "idle"}, 0},
		{"gpuhost_state", map[string]string{"phase": "switching"}, 0},
		{"gpuhost_state", map[string]string{"phase": "failed"}, 0},
		{"gpuhost_backend_unit_state", map[string]string{"unit": ollamaUnit, "state": "active"}, 1},
		{"gpuhost_backend_unit_state", map[string]string{"unit": ollamaUnit, "state": "inactive"}, 0},
		{"gpuhost_backend_unit_state", map[string]string{"unit": vllmUnit, "state": "inactive"}, 1},
		{"gpuhost_backend_unit_state", map[string]string{"unit": vllmUnit, "state": "active"}, 0},
	}
	for _, tc := range tests {
		if got := fams.value(t, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if n := len(fams.find("gpuhost_active_profile_info", nil)); n != 1 {
		t.Errorf("%d active_profile_info series, want only llama's", n)
	}
	if got := fams.count(t, "gpuhost_switch_duration_seconds", map[string]string{"profile": "llama", "result": "done"}); got != 1 {
		t.Errorf("llama switch duration count = %d, want 1", got)
	}
	// The switch to llama stopped vLLM and loaded the Ollama model.
	for step, want := range map[string]uint64{"stop": 1, "load_model": 1, "verify": 2} {
		if got := fams.count(t, "gpuhost_switch_step_duration_seconds", map[string]string{"step": step}); got != want {
			t.Errorf("step %s observed %d times, want %d", step, got, want)
		}
	}
	// Every unit shows exactly one current state.
	for _, u := range []string{vllmUnit, ollamaUnit} {
		sum := 0.0
		for _, m := range fams.find("gpuhost_backend_unit_state", map[string]string{"unit": u}) {
			sum += m.GetGauge().GetValue()
		}
		if sum != 1 {
			t.Errorf("unit %s: state values sum to %v, want 1", u, sum)
		}
	}
}

func TestFailedSwitchIsCountedWithItsDuration(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{})
	s := serve(t, f)
	// Occupy coder's port: the simulator fails to bind after loading and
	// exits, like a backend crashing while loading. From idle there is
	// nothing to roll back to, so the failed event carries no duration.
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(f.Cfg.Profiles["coder"].Port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	evs, err := f.SwitchTo(t, "coder")
	if err == nil {
		t.Fatalf("switch should fail:%s", appliancetest.Describe(evs))
	}
	var failed *api.Event
	for i := range evs {
		if evs[i].Kind == "switch" && evs[i].Status == "failed" {
			failed = &evs[i]
		}
	}
	if failed == nil || failed.DurationMS != 0 {
		t.Fatalf("want a failed switch event without a duration (the case measured from the start):%s", appliancetest.Describe(evs))
	}
	s.caughtUp(t)
	fams := s.scrape(t)
	failedLabels := map[string]string{"profile": "coder", "result": "failed"}
	if got := fams.value(t, "gpuhost_switches_total", failedLabels); got != 1 {
		t.Errorf("switches_total%v = %v, want 1", failedLabels, got)
	}
	if n := len(fams.find("gpuhost_switches_total", map[string]string{"result": "done"})); n != 0 {
		t.Errorf("%d done switches counted, want none", n)
	}
	h := fams.one(t, "gpuhost_switch_duration_seconds", failedLabels).GetHistogram()
	if h.GetSampleCount() != 1 || h.GetSampleSum() <= 0 {
		t.Errorf("failed switch duration: count %d sum %v, want 1 and > 0", h.GetSampleCount(), h.GetSampleSum())
	}
	if got := fams.value(t, "gpuhost_state", map[string]string{"phase": "failed"}); got != 1 {
		t.Errorf("state failed = %v, want 1", got)
	}
	if n := len(fams.find("gpuhost_active_profile_info", nil)); n != 0 {
		t.Errorf("active_profile_info shown after a failed switch")
	}
}

func TestProxyObservations(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{})
	s := serve(t, f)
	obs := []struct {
		model                 string
		status, prompt, compl int
		ttfb, dur             time.Duration
	}{
		{"qwen3-coder", 200, 100, 20, 50 * time.Millisecond, 2 * time.Second},
		{"qwen3-coder", 200, 300, 40, 70 * time.Millisecond, 3 * time.Second},
		{"qwen3-coder", 502, 0, 0, 0, 10 * time.Millisecond}, // backend failed: no byte, no tokens
		{"", 400, -5, -1, -time.Second, -time.Second},        // nonsense must not panic
		{"bad\xffname", 200, 1, 1, time.Millisecond, time.Millisecond},
	}
	for _, o := range obs {
		s.m.ObserveRequest(apishape.Chat, o.model, o.status, o.prompt, o.compl, o.ttfb, o.dur)
	}
	fams := s.scrape(t)
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gpuhost_proxy_requests_total", map[string]string{"model": "qwen3-coder", "code": "200"}, 2},
		{"gpuhost_proxy_requests_total", map[string]string{"model": "qwen3-coder", "code": "502"}, 1},
		{"gpuhost_proxy_requests_total", map[string]string{"model": "unknown", "code": "400"}, 1},
		{"gpuhost_proxy_requests_total", map[string]string{"model": "bad\uFFFDname", "code": "200"}, 1},
		{"gpuhost_proxy_tokens_total", map[string]string{"model": "qwen3-coder", "kind": "prompt"}, 400},
		{"gpuhost_proxy_tokens_total", map[string]string{"model": "qwen3-coder", "kind": "completion"}, 60},
	}
	for _, tc := range tests {
		if got := fams.value(t, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if n := len(fams.find("gpuhost_proxy_tokens_total", map[string]string{"model": "unknown"})); n != 0 {
		t.Errorf("negative token counts were added (%d series)", n)
	}
	coder := map[string]string{"model": "qwen3-coder"}
	ttfb := fams.one(t, "gpuhost_proxy_time_to_first_byte_seconds", coder).GetHistogram()
	if ttfb.GetSampleCount() != 2 || !near(ttfb.GetSampleSum(), 0.12) {
		t.Errorf("ttfb count %d sum %v, want 2 and 0.12 (the 502 sent no byte)", ttfb.GetSampleCount(), ttfb.GetSampleSum())
	}
	dur := fams.one(t, "gpuhost_proxy_request_duration_seconds", coder).GetHistogram()
	if dur.GetSampleCount() != 3 || !near(dur.GetSampleSum(), 5.01) {
		t.Errorf("duration count %d sum %v, want 3 and 5.01", dur.GetSampleCount(), dur.GetSampleSum())
	}
	if got := fams.count(t, "gpuhost_proxy_time_to_first_byte_seconds", map[string]string{"model": "unknown"}); got != 0 {
		t.Errorf("a negative ttfb was observed")
	}
	if h := fams.one(t, "gpuhost_proxy_request_duration_seconds", map[string]string{"model": "unknown"}).GetHistogram(); h.GetSampleSum() != 0 {
		t.Errorf("negative duration observed as %v, want clamped to 0", h.GetSampleSum())
	}
}

func TestProxyModelLabelIsBounded(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{})
	s := serve(t, f)
	for i := range maxModels + 10 {
		s.m.ObserveRequest(apishape.Chat, "model-"+strconv.Itoa(i), 200, 1, 1, time.Millisecond, time.Millisecond)
	}
	fams := s.scrape(t)
	if n := len(fams.find("gpuhost_proxy_requests_total", nil)); n != maxModels+1 {
		t.Errorf("%d request series, want %d models plus other", n, maxModels+1)
	}
	if got := fams.value(t, "gpuhost_proxy_requests_total", map[string]string{"model": "other"}); got != 10 {
		t.Errorf("other = %v, want 10", got)
	}
	// A model seen before the cap keeps its own series.
	s.m.ObserveRequest(apishape.Chat, "model-0", 200, 0, 0, 0, 0)
	if got := s.scrape(t).value(t, "gpuhost_proxy_requests_total", map[string]string{"model": "model-0"}); got != 2 {
		t.Errorf("model-0 = %v, want 2", got)
	}
}

// Metrics takes the proxy's details (hold time, stream decode rate).
var _ proxy.DetailObserver = (*Metrics)(nil)

// TestProxyDetailObservations: a held request is observed in the hold
// histogram, a streamed answer in the decode-rate one; a request neither
// held nor streamed, a stream of one token and nonsense are not observed.
func TestProxyDetailObservations(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{})
	s := serve(t, f)
	obs := []struct {
		model     string
		held      time.Duration
		stream    bool
		compl     int
		ttfb, dur time.Duration
	}{
		// held 2 s, then 21 tokens: 20 after the first over 2 s = 10 tok/s
		{"qwen3-coder", 2 * time.Second, true, 21, 2500 * time.Millisecond, 4500 * time.Millisecond},
		// not held; 41 tokens, 40 over 1 s = 40 tok/s
		{"qwen3-coder", 0, true, 41, 100 * time.Millisecond, 1100 * time.Millisecond},
		// not streamed and held 1 s: only the hold counts
		{"qwen3-coder", time.Second, false, 50, 3 * time.Second, 3 * time.Second},
		// neither held nor a usable stream: nothing
		{"qwen3-coder", 0, false, 50, time.Second, time.Second},
		{"qwen3-coder", 0, true, 1, time.Second, 2 * time.Second},
		{"", -time.Second, true, 5, -time.Second, -2 * time.Second},
	}
	for _, o := range obs {
		s.m.ObserveRequestDetail(o.model, o.held, o.stream, o.compl, o.ttfb, o.dur)
	}
	fams := s.scrape(t)
	coder := map[string]string{"model": "qwen3-coder"}
	hold := fams.one(t, "gpuhost_proxy_hold_seconds", coder).GetHistogram()
	if hold.GetSampleCount() != 2 || !near(hold.GetSampleSum(), 3) {
		t.Errorf("hold count %d sum %v, want 2 and 3", hold.GetSampleCount(), hold.GetSampleSum())
	}
	tps := fams.one(t, "gpuhost_proxy_output_tokens_per_second", coder).GetHistogram()
	if tps.GetSampleCount() != 2 || !near(tps.GetSampleSum(), 50) {
		t.Errorf("tok/s count %d sum %v, want 2 and 50 (10 + 40)", tps.GetSampleCount(), tps.GetSampleSum())
	}
	for _, name := range []string{"gpuhost_proxy_hold_seconds", "gpuhost_proxy_output_tokens_per_second"} {
		if n := len(fams.find(name, map[string]string{"model": "unknown"})); n != 0 {
			t.Errorf("%s: nonsense was observed (%d series)", name, n)
		}
	}
}

func TestDoctorStatuses(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	s := serve(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.m.waitFor(ctx, func() bool { return s.m.runs > 0 }); err != nil {
		t.Fatalf("no doctor run: %v", err)
	}
	fams := s.scrape(t)
	// The same doctor, run directly, is the reference.
	rep := f.Doctor(ctx, "")
	type key struct{ id, profile string }
	want := map[key]units.Severity{}
	for _, c := range rep.Checks {
		k := key{c.ID, c.Profile}
		if prev, ok := want[k]; !ok || severityRank(c.Severity) > severityRank(prev) {
			want[k] = c.Severity
		}
	}
	if len(want) == 0 {
		t.Fatal("the doctor reported no checks")
	}
	got := map[key]string{}
	for _, m := range fams.find("gpuhost_doctor_check_status", nil) {
		l := labelMap(m)
		k := key{l["id"], l["profile"]}
		if m.GetGauge().GetValue() == 1 {
			if prev, dup := got[k]; dup {
				t.Errorf("check %v has two current severities: %s and %s", k, prev, l["severity"])
			}
			got[k] = l["severity"]
		}
	}
	for k, sev := range want {
		if got[k] != string(sev) {
			t.Errorf("check %v: metric severity %q, doctor says %q", k, got[k], sev)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d checks in the metrics, doctor has %d", len(got), len(want))
	}
	// Spot checks that tie the series to known facts of the fixture.
	for _, tc := range []struct{ id, profile, severity string }{
		{"gpu.nvml", "", "ok"},
		{"endpoint.health", "coder", "ok"},
		{"units.exclusive", "", "ok"},
	} {
		l := map[string]string{"id": tc.id, "profile": tc.profile, "severity": tc.severity}
		if v := fams.value(t, "gpuhost_doctor_check_status", l); v != 1 {
			t.Errorf("doctor %v = %v, want 1", l, v)
		}
	}
	failing := 0
	for _, m := range fams.find("gpuhost_doctor_check_status", map[string]string{"profile": "coder-greedy", "severity": "fail"}) {
		failing += int(m.GetGauge().GetValue())
	}
	if failing == 0 {
		t.Error("coder-greedy (0.96 utilisation) shows no failing check")
	}
	ts := fams.value(t, "gpuhost_doctor_last_run_timestamp_seconds", nil)
	if age := time.Since(time.Unix(int64(ts), 0)); age < -time.Second || age > time.Minute {
		t.Errorf("doctor timestamp %v is %v old", ts, age)
	}
}

func TestDoctorRefreshesAfterASwitch(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	// No periodic run within the test: only the switch's end can cause
	// the second one.
	s := serve(t, f, func(m *Metrics) { m.doctorInterval, m.doctorMinInterval = time.Hour, 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// endpointOf names the profile whose endpoint the report found healthy.
	endpointOf := func(rep *api.DoctorReport) string {
		for _, c := range rep.Checks {
			if c.ID == "endpoint.health" && c.Severity == units.SeverityOK {
				return c.Profile
			}
		}
		return ""
	}
	if err := s.m.waitFor(ctx, func() bool { return s.m.report != nil }); err != nil {
		t.Fatalf("no first doctor run: %v", err)
	}
	if _, err := f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	if err := s.m.waitFor(ctx, func() bool { return endpointOf(s.m.report) == "llama" }); err != nil {
		t.Fatalf("the doctor did not run again after the switch to llama: %v", err)
	}
	fams := s.scrape(t)
	if v := fams.value(t, "gpuhost_doctor_check_status", map[string]string{"id": "endpoint.health", "profile": "llama", "severity": "ok"}); v != 1 {
		t.Errorf("endpoint.health for llama = %v, want 1", v)
	}
	if n := len(fams.find("gpuhost_doctor_check_status", map[string]string{"id": "endpoint.health", "profile": "coder"})); n != 0 {
		t.Errorf("stale endpoint.health series for coder remain (%d)", n)
	}
}

func TestGPUErrorStillServes(t *testing.T) {
	var simDir string
	f := appliancetest.New(t, appliancetest.Options{Hook: func(cfg *config.Config) {
		// A file where the simulator expects its claims directory: every
		// snapshot fails, as NVML does when the driver is gone.
		simDir = filepath.Join(cfg.StateDir, "not-a-dir")
		if err := os.WriteFile(simDir, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg.GPU.SimDir = simDir
	}})
	if _, err := f.Sup.Snapshot(context.Background()); err == nil {
		t.Fatalf("the snapshot should fail with sim_dir %s a file", simDir)
	}
	s := serve(t, f)
	fams := s.scrape(t) // fails the test unless 200 and parseable
	if got := fams.value(t, "gpuhost_gpu_up", nil); got != 0 {
		t.Errorf("gpuhost_gpu_up = %v, want 0", got)
	}
	for name := range fams {
		if strings.HasPrefix(name, "DCGM_") {
			t.Errorf("%s served without a GPU snapshot", name)
		}
	}
	// The rest of the endpoint is unaffected.
	if got := fams.value(t, "gpuhost_state", map[string]string{"phase": "idle"}); got != 1 {
		t.Errorf("state idle = %v, want 1", got)
	}
	if n := len(fams.find("gpuhost_backend_unit_state", map[string]string{"state": "inactive"})); n != 2 {
		t.Errorf("%d inactive unit series, want 2", n)
	}
}

func TestScrapeDoesNotWaitForASwitch(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "1500ms"})
	s := serve(t, f)
	ch, _, cancel := f.Sup.Subscribe(f.Sup.LastSeq())
	defer cancel()
	id, done, err := f.Sup.Switch(context.Background(), "coder", api.SwitchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the backend is loading: the switch now holds its lock
	// for about 1.5 s.
	deadline := time.After(30 * time.Second)
	for loading := false; !loading; {
		select {
		case e := <-ch:
			loading = e.SwitchID == id && e.Kind == "step" && e.Step == "ready" && e.Status == "started"
		case err := <-done:
			t.Fatalf("switch ended before its ready step started: %v", err)
		case <-deadline:
			t.Fatal("no ready step within 30 s")
		}
	}
	fams := s.scrape(t)
	select {
	case err := <-done:
		t.Fatalf("the switch finished (err %v) before the scrape returned: the scrape waited for it", err)
	default:
	}
	if got := fams.value(t, "gpuhost_state", map[string]string{"phase": "switching"}); got != 1 {
		t.Errorf("state switching = %v, want 1 during the switch", got)
	}
	if got := fams.value(t, "gpuhost_gpu_up", nil); got != 1 {
		t.Errorf("gpu_up = %v during the switch, want 1", got)
	}
	if n := len(fams.find("gpuhost_active_profile_info", nil)); n != 0 {
		t.Error("an active profile is shown while switching")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("switch failed: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("switch did not finish")
	}
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

func near(a, b float64) bool {
	d := a - b
	return d < 1e-9 && d > -1e-9
}

func BenchmarkScrape(b *testing.B) {
	f := appliancetest.New(b, appliancetest.Options{Activate: "coder"})
	m := New(f.Sup, nil, f.Log)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	b.ResetTimer()
	for b.Loop() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func BenchmarkObserveRequest(b *testing.B) {
	m := New(nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for b.Loop() {
		m.ObserveRequest(apishape.Chat, "qwen3-coder", 200, 1000, 200, 80*time.Millisecond, 3*time.Second)
	}
}

func TestTelegramSeries(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{})
	s := serve(t, f)
	if n := len(s.scrape(t).find("gpuhost_telegram_up", nil)); n != 0 {
		t.Fatalf("telegram series without a bot (%d)", n)
	}
	var mu sync.Mutex
	st := api.TelegramStatus{State: api.TelegramBackingOff, Reason: api.TelegramTokenRefused,
		Errors: map[string]uint64{"unauthorized": 3, "network": 0}, UpdatesSkipped: 2, NotificationsDropped: 1}
	f.Sup.SetTelegramStatus(func() api.TelegramStatus { mu.Lock(); defer mu.Unlock(); return st })
	fams := s.scrape(t)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gpuhost_telegram_up", nil, 0},
		{"gpuhost_telegram_state", map[string]string{"state": "backing_off"}, 1},
		{"gpuhost_telegram_state", map[string]string{"state": "polling"}, 0},
		{"gpuhost_telegram_state", map[string]string{"state": "stopped"}, 0},
		{"gpuhost_telegram_errors_total", map[string]string{"kind": "unauthorized"}, 3},
		{"gpuhost_telegram_errors_total", map[string]string{"kind": "network"}, 0},
		{"gpuhost_telegram_updates_skipped_total", nil, 2},
		{"gpuhost_telegram_notifications_dropped_total", nil, 1},
	} {
		if got := fams.value(t, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	mu.Lock()
	st.State, st.Reason = api.TelegramPolling, ""
	mu.Unlock()
	if got := s.scrape(t).value(t, "gpuhost_telegram_up", nil); got != 1 {
		t.Errorf("gpuhost_telegram_up = %v while polling", got)
	}
}
