package panel

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/internal/activity"
	"gpuhost/internal/sse"
	"gpuhost/units"
)

// twoGPUEnv is a panel on a simulated box with two RTX 4090s: coder on
// GPU 0 (gpus unset), llama on GPU 1, coder-greedy tensor parallel over
// both, and coder-auto (a copy of coder) placed where it fits; activate
// is switched to before the test starts.
func twoGPUEnv(t *testing.T, activate string, register func(*env, *echo.Echo)) *env {
	t.Helper()
	return newEnv(t, envOptions{register: register, fixture: appliancetest.Options{Activate: activate, Hook: func(c *config.Config) {
		c.GPU.Sim.Devices = make([]config.SimGPUDevice, 2)
		c.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
		c.Profiles["coder-greedy"].GPUs = units.GPUSet{Indices: []int{0, 1}, Given: true}
		auto := *c.Profiles["coder"]
		auto.Name, auto.ServedName = "coder-auto", "qwen3-coder-auto"
		auto.GPUs = units.GPUSet{Auto: true, Given: true}
		c.Profiles["coder-auto"] = &auto
	}}})
}

// element cuts the element that opens with the first match of open (a
// section or tbody start tag) out of page, up to its closing tag; "" when
// there is none.
func element(page, open string) string {
	loc := regexp.MustCompile(open).FindStringIndex(page)
	if loc == nil {
		return ""
	}
	tag := strings.TrimPrefix(strings.Fields(page[loc[0]:loc[1]])[0], "<")
	rest := page[loc[0]:]
	end := strings.Index(rest, "</"+tag+">")
	if end < 0 {
		return rest
	}
	return rest[:end]
}

// The dashboard has one lane per GPU: its index and short UUID in the
// heading, its memory, and on a box with several GPUs who holds memory on
// it and the profiles placed there. A one-GPU box shows its one lane as
// the GPU card it always had, under the heading "GPU 0".
func TestDashboardLanes(t *testing.T) {
	type lane struct {
		id          string
		want, avoid []string
	}
	tests := []struct {
		name  string
		env   func(t *testing.T) *env
		lanes []lane
	}{
		{"two GPUs", func(t *testing.T) *env { return twoGPUEnv(t, "llama", nil) }, []lane{
			{"gpu-0", []string{`<h2>GPU 0 <span class="muted small uuid" title="GPU-5a1f4090-`, `GPU-5a1f4090…</span></h2>`,
				`data-gpu="0"`, `data-live="mem_used">0.0</strong>`, "nobody (free)", `<dd class="placed">coder, coder-greedy</dd>`,
				"Driver", "simulated GPU"}, []string{"gpuhost-ollama.service"}},
			{"gpu-1", []string{`<h2>GPU 1 <span class="muted small uuid" title="GPU-5a1f4091-`, `data-gpu="1"`,
				`data-live="mem_used">6.1</strong>`, `<div>llama (gpuhost-ollama.service) 6200 MiB</div>`,
				`<dd class="placed">coder-greedy, llama</dd>`}, []string{"Driver", "nobody (free)"}},
		}},
		{"one GPU", func(t *testing.T) *env {
			return newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "llama"}})
		}, []lane{
			{"gpu-0", []string{`<h2>GPU 0 <span class="muted small uuid"`, `data-live="mem_used">6.1</strong>`, "Driver", "Utilisation"},
				[]string{"Holds memory", "Placed here"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := tc.env(t)
			_, body := do(t, ev.client(t), "GET", ev.srv.URL+"/", nil, nil)
			if n := strings.Count(body, `<section class="card lane"`); n != len(tc.lanes) {
				t.Fatalf("%d lanes, want %d:\n%s", n, len(tc.lanes), body)
			}
			last := -1
			for _, l := range tc.lanes {
				at := strings.Index(body, `id="`+l.id+`"`)
				if at < last {
					t.Errorf("lane %s comes before the one above it", l.id)
				}
				last = at
				sec := element(body, `<section class="card lane" id="`+l.id+`"`)
				for _, w := range l.want {
					if !strings.Contains(sec, w) {
						t.Errorf("lane %s lacks %q:\n%s", l.id, w, sec)
					}
				}
				for _, a := range l.avoid {
					if strings.Contains(sec, a) {
						t.Errorf("lane %s has %q:\n%s", l.id, a, sec)
					}
				}
			}
		})
	}
}

// /live?gpus=1 (the dashboard of a box with several GPUs asks for it)
// carries every GPU's gauges; plain /live does not.
func TestLivePerGPU(t *testing.T) {
	ev := twoGPUEnv(t, "llama", nil)
	c := ev.client(t)
	for _, tc := range []struct {
		query string
		want  map[string]string // GPU index -> mem_used; nil: no gpus
	}{
		{"", nil},
		{"?gpus=1", map[string]string{"0": "0.0", "1": "6.1"}},
	} {
		_, body := do(t, c, "GET", ev.srv.URL+"/live"+tc.query, nil, map[string]string{"Accept": "application/json"})
		var ans liveAnswer
		if err := json.Unmarshal([]byte(body), &ans); err != nil {
			t.Fatalf("/live%s: %v: %s", tc.query, err, body)
		}
		if len(ans.GPUs) != len(tc.want) {
			t.Errorf("/live%s: gpus %v, want %v", tc.query, ans.GPUs, tc.want)
		}
		for i, used := range tc.want {
			if g := ans.GPUs[i]; g.Gauges["mem_used"] != used || g.Gauges["mem_total"] != "24.0" {
				t.Errorf("/live%s: GPU %s gauges %v, want mem_used %s of 24.0", tc.query, i, g.Gauges, used)
			}
		}
		if ans.Gauges["mem_used"] != "0.0" {
			t.Errorf("/live%s: GPU 0's gauges %v (GPU 0 holds nothing)", tc.query, ans.Gauges)
		}
	}
}

// The profiles page groups the Switch buttons by GPU set: single GPUs in
// index order, then sets of several, then auto; each button is the same
// form as before (POST /switch with the CSRF token), and it switches.
func TestProfilesGroupedByGPUSet(t *testing.T) {
	tests := []struct {
		name   string
		env    func(t *testing.T) *env
		groups [][2]string // set key, heading
		rows   map[string][]string
		target string // switched to from its group's form
	}{
		{"two GPUs", func(t *testing.T) *env { return twoGPUEnv(t, "coder", nil) },
			[][2]string{{"0", "GPU 0"}, {"1", "GPU 1"}, {"0,1", "GPU 0+1"}, {"auto", "auto"}},
			map[string][]string{"0": {"coder"}, "1": {"llama"}, "0,1": {"coder-greedy"}, "auto": {"coder-auto"}}, "llama"},
		{"one GPU", func(t *testing.T) *env {
			return newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
		}, [][2]string{{"0", "GPU 0"}}, map[string][]string{"0": {"coder", "coder-greedy", "llama"}}, "llama"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := tc.env(t)
			c := ev.client(t)
			_, page := do(t, c, "GET", ev.srv.URL+"/profiles", nil, nil)
			heads := regexp.MustCompile(`<tbody class="lane" data-gpus="([^"]+)">\s*<tr class="lane-head"><th colspan="6" scope="rowgroup" id="lane-[^"]+">([^<]+)`).FindAllStringSubmatch(page, -1)
			if len(heads) != len(tc.groups) {
				t.Fatalf("%d groups, want %d:\n%s", len(heads), len(tc.groups), page)
			}
			for i, g := range tc.groups {
				if key, head := heads[i][1], html.UnescapeString(strings.TrimSpace(heads[i][2])); key != g[0] || head != g[1] {
					t.Errorf("group %d is %s %q, want %s %q", i, key, head, g[0], g[1])
				}
				body := element(page, `<tbody class="lane" data-gpus="`+regexp.QuoteMeta(g[0])+`">`)
				got := regexp.MustCompile(`<tr data-profile="([^"]+)"`).FindAllStringSubmatch(body, -1)
				var names []string
				for _, m := range got {
					names = append(names, m[1])
				}
				if strings.Join(names, ",") != strings.Join(tc.rows[g[0]], ",") {
					t.Errorf("group %s has %v, want %v", g[0], names, tc.rows[g[0]])
				}
				if n := strings.Count(body, `<form method="post" action="/switch" class="switch-form">`); n != len(names) {
					t.Errorf("group %s has %d switch forms for %d profiles", g[0], n, len(names))
				}
			}
			resp, _ := do(t, c, "POST", ev.srv.URL+"/switch", url.Values{"csrf": {csrfOf(t, page)}, "profile": {tc.target}}, nil)
			if resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("switch to %s: status %d", tc.target, resp.StatusCode)
			}
			id := strings.TrimPrefix(resp.Header.Get("Location"), "/profiles?switch=")
			if ls := waitSwitched(t, ev.f.Sup, id); !ls.OK || ls.Profile != tc.target {
				t.Errorf("switch %s: %+v", id, ls)
			}
		})
	}
}

// The Activity page tells requests apart by the GPU set of the profile
// that served them: a GPUs column, a filter (?gpus=, also on the live
// stream) and a 400 for a set that is not one. A box whose profiles all
// run on one set shows neither column nor filter.
func TestActivityPerGPUSet(t *testing.T) {
	ev := twoGPUEnv(t, "coder", nil)
	rec := activity.New(activity.Options{LogSize: 50, GPU: ev.f.Sup, Events: ev.f.Sup})
	ev.p.SetActivity(rec)
	for _, r := range []struct{ model, profile string }{
		{"qwen3-coder", "coder"}, {"llama3.1:8b", "llama"}, {"greedy", "coder-greedy"}, {"qwen3-coder-auto", "coder-auto"}, {"", ""},
	} {
		rec.Record(activity.Request{Time: time.Now(), Client: "127.0.0.1", Method: "POST", Path: "/v1/chat/completions", API: "chat",
			Model: r.model, Profile: r.profile, Status: 200})
	}
	c := ev.client(t)
	_, page := do(t, c, http.MethodGet, ev.srv.URL+"/activity", nil, nil)
	for _, w := range []string{"<th>GPUs</th>", `<select name="gpus">`, `<option value="0,1">GPU 0&#43;1</option>`, `data-gpu-column="true"`,
		`<td class="gpus">GPU 0</td>`, `<td class="gpus">GPU 1</td>`, `<td class="gpus">GPU 0&#43;1</td>`, `<td class="gpus">auto</td>`,
		`<td class="gpus"><span class="muted">–</span></td>`} {
		if !strings.Contains(page, w) {
			t.Errorf("/activity lacks %q", w)
		}
	}
	seqs := func(page string) string {
		var out []string
		for _, m := range regexp.MustCompile(`<tr data-seq="(\d+)">`).FindAllStringSubmatch(page, -1) {
			out = append(out, m[1])
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct{ query, want string }{
		{"", "5,4,3,2,1"}, {"gpus=0", "1"}, {"gpus=1", "2"}, {"gpus=0,1", "3"}, {"gpus=auto", "4"}, {"gpus=7", ""}, {"gpus=1&status=5xx", ""},
	} {
		_, page := do(t, c, http.MethodGet, ev.srv.URL+"/activity?"+tc.query, nil, nil)
		if got := seqs(page); got != tc.want {
			t.Errorf("?%s: rows %q, want %q", tc.query, got, tc.want)
		}
	}
	for _, q := range []string{"gpus=GPU0", "gpus=0+1", "gpus=" + strings.Repeat("1,", 40) + "1"} {
		resp, body := do(t, c, http.MethodGet, ev.srv.URL+"/activity?"+q, nil, map[string]string{"Accept": "application/json"})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "is not a GPU set") {
			t.Errorf("?%s: %d %s", q, resp.StatusCode, body)
		}
	}
	// The live stream filters the same way and says the set of each row.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ev.srv.URL+"/activity/events?after=0&gpus=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	go rec.Record(activity.Request{Model: "llama3.1:8b", Profile: "llama", Status: 200})
	rd := sse.NewReader(resp.Body, 0)
	var got []string
	for len(got) < 2 {
		e, err := rd.Next()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		var r requestRow
		if e.Type != "request" || json.Unmarshal(e.Data, &r) != nil {
			t.Fatalf("event %s %q", e.Type, e.Data)
		}
		got = append(got, strconv.FormatUint(r.Seq, 10)+" "+r.GPUs)
	}
	if strings.Join(got, "; ") != "2 GPU 1; 6 GPU 1" {
		t.Errorf("stream with gpus=1: %q", got)
	}

	one, oneRec := newActivityEnv(t)
	seedRequests(oneRec)
	if _, page := do(t, one.client(t), http.MethodGet, one.srv.URL+"/activity", nil, nil); strings.Contains(page, "<th>GPUs</th>") ||
		strings.Contains(page, `name="gpus"`) || strings.Contains(page, `class="gpus"`) {
		t.Error("a box with one GPU set shows the GPUs column or filter")
	}
}
