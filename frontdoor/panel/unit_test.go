package panel

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

func TestStepLabel(t *testing.T) {
	tests := []struct {
		step   string
		status api.EventStatus
		detail map[string]any
		before int64
		want   string
	}{
		{"stop", "started", nil, -1, "stopping"},
		{"stop", "done", nil, -1, "stopped"},
		{"drain", "started", nil, -1, "draining requests in flight"},
		{"drain", "done", map[string]any{"drained": 2, "cut": 1}, -1, "requests drained: 2 finished, 1 cut"},
		{"drain", "done", map[string]any{"drained": float64(0), "cut": float64(0)}, -1, "requests drained: 0 finished, 0 cut"},
		{"vram_release", "done", map[string]any{"used_mib": uint64(18), "total_mib": uint64(24564)}, 22630, "VRAM released 22.1 → 0.0 GiB"},
		{"vram_release", "done", map[string]any{"used_mib": float64(512)}, -1, "VRAM released → 0.5 GiB"},
		{"vram_release", "done", nil, 100, "VRAM released"},
		{"vram_release", "failed", map[string]any{"used_mib": 20000}, 100, "waiting for VRAM release failed"},
		{"ready", "done", nil, -1, "ready"},
		{"verify", "done", map[string]any{"used_mib": uint64(6218), "total_mib": uint64(24564)}, -1, "verified · 6.1/24.0 GiB used"},
		{"rollback.start", "started", nil, -1, "rollback: starting"},
		{"rollback.vram_release", "done", map[string]any{"used_mib": int64(18)}, 2048, "rollback: VRAM released 2.0 → 0.0 GiB"},
		{"something_new", "done", nil, -1, "something_new done"},
		{"vram_release", "done", map[string]any{"used_mib": -5.0}, -1, "VRAM released"},
	}
	for _, tt := range tests {
		if got := stepLabel(tt.step, tt.status, tt.detail, tt.before); got != tt.want {
			t.Errorf("stepLabel(%s, %s, %v, %d) = %q, want %q", tt.step, tt.status, tt.detail, tt.before, got, tt.want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for ms, want := range map[float64]string{0: "", -1: "", 0.4: "<1 ms", 12.6: "13 ms", 1530: "1.5 s", 119000: "119.0 s", 180000: "3.0 min"} {
		if got := formatDuration(ms); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", ms, got, want)
		}
	}
}

func TestBuildProgress(t *testing.T) {
	ev := func(kind api.EventKind, step string, status api.EventStatus, ms float64, detail map[string]any) api.Event {
		return api.Event{Kind: kind, SwitchID: "ab12", Profile: "llama", Step: step, Status: status, DurationMS: ms, Detail: detail, Message: step + " " + string(status)}
	}
	full := []api.Event{
		ev("switch", "", "started", 0, nil),
		{Kind: "unit", Message: "other event"},
		ev("step", "stop", "started", 0, nil),
		ev("step", "stop", "done", 420, nil),
		ev("step", "vram_release", "started", 0, nil),
		ev("step", "vram_release", "done", 35, map[string]any{"used_mib": uint64(18)}),
		ev("step", "start", "started", 0, nil),
	}
	for i := range full {
		full[i].Seq = uint64(i + 1)
	}
	tests := []struct {
		name    string
		events  []api.Event
		state   api.State
		running bool
		outcome string
		labels  []string
	}{
		{"running", full, api.State{SwitchID: "ab12"}, true, "",
			[]string{"stopped", "VRAM released 20.0 → 0.0 GiB", "starting"}},
		{"done", append(append([]api.Event{}, full...), ev("step", "start", "done", 5, nil), ev("switch", "", "done", 1500, nil)),
			api.State{}, false, "done", []string{"stopped", "VRAM released 20.0 → 0.0 GiB", "started"}},
		{"failed with rollback", append(append([]api.Event{}, full...),
			ev("step", "start", "failed", 5, nil), ev("switch", "", "info", 0, nil), ev("step", "rollback.start", "done", 3, nil), ev("switch", "", "failed", 9, nil)),
			api.State{}, false, "failed", []string{"stopped", "VRAM released 20.0 → 0.0 GiB", "starting failed", " info", "rollback: started"}},
		{"end lost", full, api.State{SwitchID: "other"}, false, "unknown", []string{"stopped", "VRAM released 20.0 → 0.0 GiB", "starting"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pv := buildProgress("ab12", tt.events, 20480, tt.state)
			if !pv.Found || pv.Running != tt.running || pv.Outcome != tt.outcome || pv.Profile != "llama" {
				t.Fatalf("progress %+v", pv)
			}
			var got []string
			for _, s := range pv.Steps {
				got = append(got, s.Label)
			}
			if strings.Join(got, "|") != strings.Join(tt.labels, "|") {
				t.Errorf("labels %q, want %q", got, tt.labels)
			}
		})
	}
	if pv := buildProgress("zz", full, -1, api.State{}); pv.Found || len(pv.Steps) != 0 {
		t.Errorf("another switch's events leaked in: %+v", pv)
	}
	if pv := buildProgress("ab12", full[:4], -1, api.State{SwitchID: "ab12"}); pv.Steps[0].Duration != "420 ms" || pv.Since != 4 {
		t.Errorf("duration/since: %+v", pv)
	}
}

func TestDoctorCache(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	run := func(ctx context.Context, profile string) api.DoctorReport {
		runs.Add(1)
		<-release
		return api.DoctorReport{Worst: "ok", Checks: []api.DoctorCheck{{ID: "x", Severity: units.SeverityOK}}}
	}
	d := newDoctorCache(run, 30*time.Second, 5*time.Second)
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	d.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(dt time.Duration) { mu.Lock(); now = now.Add(dt); mu.Unlock() }

	// Concurrent page views share one run.
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rep, _ := d.get(context.Background(), false, "a"); rep == nil || rep.Worst != "ok" {
				t.Errorf("report %+v", rep)
			}
		}()
	}
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	steps := []struct {
		advance time.Duration
		refresh bool
		key     string
		runs    int32
	}{
		{0, false, "a", 1},
		{10 * time.Second, false, "a", 1}, // within the TTL
		{0, true, "a", 2},                 // refresh: older than the minimum interval
		{time.Second, true, "a", 2},       // refresh again too soon
		{31 * time.Second, false, "a", 3}, // TTL passed
		{time.Second, false, "b", 4},      // the backend changed: the report is stale
		{time.Second, false, "b", 4},
	}
	for i, s := range steps {
		advance(s.advance)
		d.get(context.Background(), s.refresh, s.key)
		if got := runs.Load(); got != s.runs {
			t.Fatalf("step %d: %d runs, want %d", i, got, s.runs)
		}
	}
	// A page that gives up waiting gets what there is, and the run goes on.
	block := make(chan struct{})
	defer close(block)
	slow := newDoctorCache(func(ctx context.Context, _ string) api.DoctorReport {
		<-block
		return api.DoctorReport{Worst: "late"}
	}, time.Minute, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if rep, _ := slow.get(ctx, false, ""); rep != nil {
		t.Errorf("cancelled first get returned %+v", rep)
	}
	if rep, at := newDoctorCache(nil, time.Minute, time.Second).get(context.Background(), false, ""); rep != nil || !at.IsZero() {
		t.Errorf("nil doctor: %+v", rep)
	}
}

func TestVerdicts(t *testing.T) {
	rep := &api.DoctorReport{Checks: []api.DoctorCheck{
		{ID: "gpu.driver", Severity: units.SeverityOK},
		{ID: "a", Profile: "p", Severity: units.SeverityOK, Message: "fine"},
		{ID: "b", Profile: "p", Severity: units.SeverityWarn, Message: "hmm"},
		{ID: "c", Profile: "q", Severity: units.SeverityFail, Message: "bad"},
		{ID: "d", Profile: "q", Severity: units.SeverityWarn, Message: "meh"},
	}}
	v := verdicts(rep)
	if v["p"].Severity != "warn" || v["p"].Summary != "b: hmm" || v["q"].Severity != "fail" || v["q"].Summary != "c: bad; d: meh" || len(v) != 2 {
		t.Errorf("verdicts %+v", v)
	}
	if len(verdicts(nil)) != 0 {
		t.Error("nil report has verdicts")
	}
}

func TestSessionStore(t *testing.T) {
	s := newSessionStore(time.Hour, 3)
	t0 := time.Unix(5000, 0)
	th := [32]byte{1}
	other := [32]byte{2}
	var ids []string
	for i := range 4 {
		id, err := s.create(t0.Add(time.Duration(i)*time.Second), th)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	tests := []struct {
		name  string
		id    string
		at    time.Time
		token [32]byte
		want  bool
	}{
		{"oldest evicted at the cap", ids[0], t0, th, false},
		{"live", ids[3], t0.Add(time.Minute), th, true},
		{"token rotated", ids[2], t0, other, false},
		{"after rotation the session is gone", ids[2], t0, th, false},
		{"expired", ids[1], t0.Add(2 * time.Hour), th, false},
		{"malformed", "x", t0, th, false},
		{"unknown", strings.Repeat("A", 43), t0, th, false},
	}
	for _, tt := range tests {
		if got := s.valid(tt.id, tt.at, tt.token); got != tt.want {
			t.Errorf("%s: valid = %v, want %v", tt.name, got, tt.want)
		}
	}
	s.remove(ids[3])
	if s.valid(ids[3], t0, th) || s.len() != 0 {
		t.Errorf("remove left %d sessions", s.len())
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                              "/",
		"/profiles":                     "/profiles",
		"/profiles?switch=ab":           "/profiles?switch=ab",
		"//evil.example/":               "/",
		"/\\evil.example":               "/",
		"https://evil.example/":         "/",
		"profiles":                      "/",
		"/login":                        "/",
		"/logout?x=1":                   "/",
		"/%2F%2Fevil":                   "/", // decodes to //evil: refused to be safe
		"/a\nb":                         "/",
		"javascript:alert(1)":           "/",
		"/" + strings.Repeat("a", 3000): "/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	tests := []struct {
		site, origin, scheme, host string
		want                       error
	}{
		{"", "", "http", "127.0.0.1:8080", nil},
		{"same-origin", "http://127.0.0.1:8080", "http", "127.0.0.1:8080", nil},
		{"same-origin", "HTTP://LOCALHOST:8080", "http", "localhost:8080", nil},
		{"cross-site", "", "http", "h", errCrossSite},
		{"same-site", "", "http", "h", errCrossSite},
		{"none", "", "http", "h", errCrossSite},
		{"", "https://127.0.0.1:8080", "http", "127.0.0.1:8080", errOrigin},
		{"", "http://127.0.0.1:8081", "http", "127.0.0.1:8080", errOrigin},
		{"", "null", "http", "h", errOrigin},
		{"", "http://u@h", "http", "h", errOrigin},
		{"", "http://h/path", "http", "h", errOrigin},
	}
	for _, tt := range tests {
		if err := sameOrigin(tt.site, tt.origin, tt.scheme, tt.host); !errors.Is(err, tt.want) && !(err == nil && tt.want == nil) {
			t.Errorf("sameOrigin(%q, %q, %q, %q) = %v, want %v", tt.site, tt.origin, tt.scheme, tt.host, err, tt.want)
		}
	}
}

// FuzzSafeNext: whatever the login form gets as next, the redirect stays on
// this site.
func FuzzSafeNext(f *testing.F) {
	for _, s := range []string{"/", "/profiles?switch=1", "//x", "/\\x", "http://x", "/%0d%0aSet-Cookie:x", "/\t/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, next string) {
		got := safeNext(next)
		if got != "/" && got != next {
			t.Fatalf("safeNext(%q) = %q: neither the input nor /", next, got)
		}
		u, err := url.Parse(got)
		if err != nil || u.Host != "" || u.Scheme != "" || !strings.HasPrefix(got, "/") || strings.HasPrefix(got, "//") || strings.ContainsAny(got, "\\\r\n") {
			t.Fatalf("safeNext(%q) = %q leaves the site", next, got)
		}
	})
}

// FuzzSameOrigin: an accepted Origin names exactly the request's host.
func FuzzSameOrigin(f *testing.F) {
	f.Add("same-origin", "http://127.0.0.1:8080", "http", "127.0.0.1:8080")
	f.Add("", "null", "http", "h")
	f.Add("", "http://[::1]:80", "http", "[::1]:80")
	f.Fuzz(func(t *testing.T, site, origin, scheme, host string) {
		if sameOrigin(site, origin, scheme, host) != nil {
			return
		}
		if site != "" && site != "same-origin" {
			t.Fatalf("accepted Sec-Fetch-Site %q", site)
		}
		if origin != "" {
			u, err := url.Parse(origin)
			if err != nil || !strings.EqualFold(u.Host, host) || !strings.EqualFold(u.Scheme, scheme) {
				t.Fatalf("accepted Origin %q for %s://%s", origin, scheme, host)
			}
		}
	})
}
