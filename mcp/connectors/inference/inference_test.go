package inference

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	gpuconfig "gpuhost/config"
	"gpuhost/internal/testkit"
	"gpuhost/mcp/connector"
	"gpuhost/units"
)

// fixtureDaemon is Daemon over a real Supervisor with simulated GPU
// and backends (real processes answering real HTTP).
type fixtureDaemon struct {
	f     *appliancetest.Fixture
	bench []bench.Summary
	err   error
}

func (d fixtureDaemon) Status(ctx context.Context) api.Status { return d.f.Sup.Status(ctx) }
func (d fixtureDaemon) Doctor(ctx context.Context, p string) api.DoctorReport {
	return d.f.Doctor(ctx, p)
}
func (d fixtureDaemon) BenchResults() ([]bench.Summary, error) { return d.bench, d.err }

// staticDaemon reports a fixed Status, for endpoint shapes the fixture
// cannot produce on demand (a backend answering 503, hanging, gone).
type staticDaemon struct{ st api.Status }

func (d staticDaemon) Status(context.Context) api.Status { return d.st }
func (d staticDaemon) Doctor(context.Context, string) api.DoctorReport {
	return api.DoctorReport{}
}
func (d staticDaemon) BenchResults() ([]bench.Summary, error) { return nil, nil }

func node(t *testing.T, s string) yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
		t.Fatal(err)
	}
	return *doc.Content[0]
}

func build(t *testing.T, env connector.Env) map[string]connector.Tool {
	t.Helper()
	env.Name = "inference"
	tools, err := (&builder{}).Build(env)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]connector.Tool{}
	for _, tl := range tools {
		a := tl.Def.Annotations
		if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
			t.Fatalf("%s: annotations %+v, want readOnly true and destructive false", tl.Def.Name, a)
		}
		if !strings.HasPrefix(tl.Def.Name, "inference_") {
			t.Fatalf("tool %q is not prefixed inference_", tl.Def.Name)
		}
		for _, bad := range []string{"switch", "stop", "start", "restart"} {
			if strings.Contains(tl.Def.Name, bad) {
				t.Fatalf("tool %q looks like it changes something", tl.Def.Name)
			}
		}
		out[tl.Def.Name] = tl
	}
	for _, n := range []string{"inference_status", "inference_profiles", "inference_doctor", "inference_bench_latest"} {
		if out[n].Handler == nil {
			t.Fatalf("tool %s missing; got %v", n, out)
		}
	}
	if len(out) != 4 {
		t.Fatalf("got %d tools, want 4", len(out))
	}
	return out
}

func call(t *testing.T, tl connector.Tool, args connector.Args) any {
	t.Helper()
	out, err := tl.Handler(context.Background(), args)
	if err != nil {
		t.Fatalf("%s(%v): %v", tl.Def.Name, args, err)
	}
	return out
}

func TestBuildConfig(t *testing.T) {
	tests := []struct {
		name, yaml string
		daemon     any
		want       string // error substring; "" = ok
	}{
		{"no daemon", "", nil, "needs the running gpuhost daemon"},
		{"daemon without the reads", "", struct{}{}, "cannot report status, doctor and bench results"},
		{"defaults", "", staticDaemon{}, ""},
		{"timeout", "health_timeout: 500ms\n", staticDaemon{}, ""},
		{"unknown key", "switch_allowed: true\n", staticDaemon{}, "switch_allowed"},
		{"bad duration", "health_timeout: soon\n", staticDaemon{}, "mcp.connectors.inference"},
		{"zero timeout", "health_timeout: 0s\n", staticDaemon{}, "health_timeout 0s"},
		{"huge timeout", "health_timeout: 2h\n", staticDaemon{}, "at most 1m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := connector.Env{Name: "inference", Daemon: tt.daemon}
			if tt.yaml != "" {
				env.Config = node(t, tt.yaml)
			}
			_, err := (&builder{}).Build(env)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Build: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Build: err = %v, want it to contain %q", err, tt.want)
			}
			if tt.daemon == nil && !errors.Is(err, ErrNoDaemon) {
				t.Fatalf("err = %v, want ErrNoDaemon", err)
			}
		})
	}
}

func TestAgainstRealSupervisor(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder"})
	tools := build(t, connector.Env{Daemon: fixtureDaemon{f: f}, HTTP: &http.Client{}})

	// The doctor's profile parameter is an enum of the configured names.
	prop, ok := tools["inference_doctor"].Def.InputSchema.Properties["profile"].(map[string]any)
	if !ok {
		t.Fatalf("inference_doctor has no profile property: %+v", tools["inference_doctor"].Def.InputSchema)
	}
	if got := fmt.Sprint(prop["enum"]); got != "[coder coder-greedy llama]" {
		t.Fatalf("profile enum = %s", got)
	}
	if tg := tools["inference_doctor"].Targets; tg == nil || tg.Param != "profile" || fmt.Sprint(tg.Values) != "[coder coder-greedy llama]" {
		t.Fatalf("inference_doctor targets %+v", tg)
	}

	st := call(t, tools["inference_status"], nil).(StatusResult)
	if st.Phase != api.PhaseActive || st.Profile != "coder" || st.Active == nil || st.Active.ServedName != "qwen3-coder" {
		t.Fatalf("status %+v", st)
	}
	if st.Endpoint == nil || !st.Endpoint.Healthy || st.Endpoint.HTTPCode != 200 ||
		st.Endpoint.URL != "http://127.0.0.1:"+strconv.Itoa(st.Active.Port)+"/health" {
		t.Fatalf("endpoint %+v, want the vLLM simulator's /health answering 200", st.Endpoint)
	}
	if len(st.Units) == 0 || st.LastSwitch == nil || !st.LastSwitch.OK {
		t.Fatalf("status units %+v last switch %+v", st.Units, st.LastSwitch)
	}
	if len(st.GPUs) != 1 || fmt.Sprint(st.GPUs[0].Serving) != "[coder]" || !strings.Contains(st.GPUs[0].Line, "GPU 0 ") ||
		!strings.Contains(st.GPUs[0].Line, "coder (gpuhost-vllm.service)") {
		t.Fatalf("status GPUs %+v, want GPU 0 serving coder", st.GPUs)
	}

	ps := call(t, tools["inference_profiles"], nil).(ProfilesResult)
	if len(ps.Profiles) != 3 {
		t.Fatalf("profiles %+v", ps)
	}
	for _, p := range ps.Profiles {
		if p.Active != (p.Name == "coder") || p.Port == 0 || p.Model == "" || p.GPUs != "[0]" {
			t.Fatalf("profile %+v", p)
		}
	}

	greedy := call(t, tools["inference_doctor"], connector.Args{"profile": "coder-greedy"}).(api.DoctorReport)
	if greedy.Worst != string(units.SeverityFail) || len(greedy.Checks) == 0 {
		t.Fatalf("doctor coder-greedy: worst %q, want fail; %+v", greedy.Worst, greedy)
	}
	all := call(t, tools["inference_doctor"], nil).(api.DoctorReport)
	if len(all.Checks) <= len(greedy.Checks)/2 {
		t.Fatalf("doctor for all profiles has %d checks", len(all.Checks))
	}
	if _, err := tools["inference_doctor"].Handler(context.Background(), connector.Args{"profile": "nope"}); err == nil ||
		!strings.Contains(err.Error(), `unknown profile "nope": choose one of coder, coder-greedy, llama`) {
		t.Fatalf("doctor unknown profile: err = %v", err)
	}

	// The Ollama backend answers its own health path.
	if evs, err := f.SwitchTo(t, "llama"); err != nil {
		t.Fatalf("switch to llama: %v%s", err, appliancetest.Describe(evs))
	}
	st = call(t, tools["inference_status"], nil).(StatusResult)
	if st.Profile != "llama" || st.Endpoint == nil || !st.Endpoint.Healthy || !strings.HasSuffix(st.Endpoint.URL, "/api/version") {
		t.Fatalf("status after switch %+v endpoint %+v", st, st.Endpoint)
	}
	if len(st.GPUs) != 1 || fmt.Sprint(st.GPUs[0].Serving) != "[llama]" {
		t.Fatalf("status GPUs after the switch %+v, want GPU 0 serving llama", st.GPUs)
	}
}

// On a box with two GPUs inference_status says per GPU what serves on
// it, and inference_profiles where each profile runs.
func TestStatusPerGPUOnRealSupervisor(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "llama", Hook: func(c *gpuconfig.Config) {
		c.GPU.Sim.Devices = make([]gpuconfig.SimGPUDevice, 2)
		c.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
		c.Profiles["coder-greedy"].GPUs = units.GPUSet{Indices: []int{0, 1}, Given: true}
	}})
	tools := build(t, connector.Env{Daemon: fixtureDaemon{f: f}, HTTP: &http.Client{}})
	st := call(t, tools["inference_status"], nil).(StatusResult)
	if len(st.GPUs) != 2 {
		t.Fatalf("status GPUs %+v, want two", st.GPUs)
	}
	for i, want := range []struct {
		serving, placed, line string
	}{
		{"[]", "[coder coder-greedy]", "GPU 0 NVIDIA GeForce RTX 4090 (GPU-5a1f4090…) 0.0/24.0 GiB: free"},
		{"[llama]", "[coder-greedy llama]", "GPU 1 NVIDIA GeForce RTX 4090 (GPU-5a1f4091…) 6.1/24.0 GiB: llama (gpuhost-ollama.service) 6200 MiB"},
	} {
		g := st.GPUs[i]
		if fmt.Sprint(g.Serving) != want.serving || fmt.Sprint(g.Placed) != want.placed || g.Line != want.line || g.UUID == "" {
			t.Errorf("GPU %d: serving %v placed %v line %q; want %s %s %q", g.Index, g.Serving, g.Placed, g.Line, want.serving, want.placed, want.line)
		}
	}
	gpus := map[string]string{}
	for _, p := range call(t, tools["inference_profiles"], nil).(ProfilesResult).Profiles {
		gpus[p.Name] = p.GPUs
	}
	if fmt.Sprint(gpus) != "map[coder:[0] coder-greedy:[0, 1] llama:[1]]" {
		t.Errorf("profiles' GPUs %v", gpus)
	}
}

// gpuViews: who serves on each GPU, from the holders (a profile listed
// once per GPU however many processes it has there; processes that are
// not gpuhost's serve nothing).
func TestGPUViews(t *testing.T) {
	held := func(pid int, mib uint64, unit, profile string) api.GPUHolder {
		return api.GPUHolder{PID: pid, Name: "proc", UsedMiB: mib, Unit: unit, Profile: profile}
	}
	tests := []struct {
		name    string
		gpus    []api.GPUStatus
		serving []string // per GPU, joined by ","
	}{
		{"none", nil, nil},
		{"free GPU", []api.GPUStatus{{Index: 0}}, []string{""}},
		{"tensor parallel over two, two ranks on one, a foreign process",
			[]api.GPUStatus{
				{Index: 0, Holders: []api.GPUHolder{held(1, 9000, "gpuhost-vllm.service", "big"), held(2, 100, "gpuhost-vllm.service", "big"), held(3, 500, "", "")}},
				{Index: 1, Holders: []api.GPUHolder{held(4, 9000, "gpuhost-vllm.service", "big"), held(5, 6200, "gpuhost-ollama.service", "llama")}},
			}, []string{"big", "big,llama"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs := gpuViews(tc.gpus)
			if len(vs) != len(tc.gpus) {
				t.Fatalf("%d views for %d GPUs", len(vs), len(tc.gpus))
			}
			for i, v := range vs {
				if got := strings.Join(v.Serving, ","); got != tc.serving[i] || v.Holders == nil || v.Line != tc.gpus[i].Line() {
					t.Errorf("GPU %d: serving %q holders %v line %q, want serving %q", i, got, v.Holders, v.Line, tc.serving[i])
				}
			}
		})
	}
}

func TestNoProfilesNoDoctorParameter(t *testing.T) {
	tools := build(t, connector.Env{Daemon: staticDaemon{}})
	d := tools["inference_doctor"]
	if _, ok := d.Def.InputSchema.Properties["profile"]; ok || d.Targets != nil {
		t.Fatalf("doctor without profiles: schema %+v targets %+v; an empty enum would reject every call", d.Def.InputSchema, d.Targets)
	}
}

func TestIdle(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{})
	tools := build(t, connector.Env{Daemon: fixtureDaemon{f: f}})
	st := call(t, tools["inference_status"], nil).(StatusResult)
	if st.Phase != api.PhaseIdle || st.Active != nil || st.Endpoint != nil || !strings.Contains(st.Note, "no inference backend") {
		t.Fatalf("idle status %+v", st)
	}
}

func TestEndpointFailures(t *testing.T) {
	unavailable := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			t.Errorf("probe asked %s, want /health", r.URL.Path)
		}
		http.Error(w, "loading", http.StatusServiceUnavailable)
	}))
	defer unavailable.Close()
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hanging.Close()

	port := func(s *httptest.Server) int { return s.Listener.Addr().(*net.TCPAddr).Port }
	tests := []struct {
		name string
		port int
		want string
	}{
		{"503", port(unavailable), "health check answered 503"},
		{"hangs", port(hanging), "no answer within 100ms"},
		{"nothing listening", testkit.FreePort(t), "not reachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := api.Status{State: api.State{Phase: api.PhaseActive, Profile: "coder"},
				Profiles: []api.ProfileInfo{{Name: "coder", Backend: units.VLLM, Port: tt.port, Active: true}}}
			tools := build(t, connector.Env{Daemon: staticDaemon{st}, Config: node(t, "health_timeout: 100ms\n")})
			res := call(t, tools["inference_status"], nil).(StatusResult)
			if res.Endpoint == nil || res.Endpoint.Healthy || !strings.Contains(res.Endpoint.Error, tt.want) {
				t.Fatalf("endpoint %+v, want unhealthy with %q", res.Endpoint, tt.want)
			}
		})
	}
}

func TestBenchLatest(t *testing.T) {
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var runs []bench.Summary
	for _, day := range []int{3, 1, 7, 5, 2, 6, 4} {
		runs = append(runs, bench.Summary{ID: fmt.Sprintf("run-%d", day), StartedAt: base.AddDate(0, 0, day), Status: "done"})
	}
	tests := []struct {
		name    string
		runs    []bench.Summary
		err     error
		args    connector.Args
		wantIDs string
		wantErr string
	}{
		{"default five newest", runs, nil, nil, "run-7 run-6 run-5 run-4 run-3", ""},
		{"limit 2", runs, nil, connector.Args{"limit": 2.0}, "run-7 run-6", ""},
		{"limit above count", runs[:2], nil, connector.Args{"limit": 20.0}, "run-3 run-1", ""},
		{"none yet", nil, nil, nil, "", ""},
		{"store error", nil, errors.New("open /var/lib/gpuhost/bench: permission denied"), nil, "", "reading the benchmark results failed: open"},
		{"limit zero", runs, nil, connector.Args{"limit": 0.0}, "", "whole number from 1 to 20"},
		{"limit fraction", runs, nil, connector.Args{"limit": 2.5}, "", "whole number from 1 to 20"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := benchDaemon{runs: tt.runs, err: tt.err}
			tools := build(t, connector.Env{Daemon: d})
			out, err := tools["inference_bench_latest"].Handler(context.Background(), tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			res := out.(BenchResult)
			var ids []string
			for _, r := range res.Results {
				ids = append(ids, r.ID)
			}
			if got := strings.Join(ids, " "); got != tt.wantIDs || res.Total != len(tt.runs) {
				t.Fatalf("ids %q total %d, want %q total %d", got, res.Total, tt.wantIDs, len(tt.runs))
			}
			if (len(tt.runs) == 0) != (res.Note != "") {
				t.Fatalf("note %q", res.Note)
			}
		})
	}
}

type benchDaemon struct {
	staticDaemon
	runs []bench.Summary
	err  error
}

func (d benchDaemon) BenchResults() ([]bench.Summary, error) { return d.runs, d.err }

// On a box whose profiles run on several GPU sets, inference_status lists
// every lane with its GPUs, phase and profile, and probes the endpoint of
// each lane's active profile (GPU 0's once); a box of one lane has no
// lanes in its answer.
func TestStatusLanes(t *testing.T) {
	var hits [2]atomic.Int32
	healthy := func(i int) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits[i].Add(1) }))
		t.Cleanup(s.Close)
		return s
	}
	port := func(s *httptest.Server) int { return s.Listener.Addr().(*net.TCPAddr).Port }
	coderPort, llamaPort := port(healthy(0)), port(healthy(1))
	profiles := []api.ProfileInfo{{Name: "coder", Backend: units.VLLM, Port: coderPort, Active: true},
		{Name: "llama", Backend: units.Ollama, Port: llamaPort, Active: true}, {Name: "tp", Backend: units.VLLM, Port: testkit.FreePort(t)}}
	gpu0 := api.State{Lane: "GPU 0", GPUs: []int{0}, Phase: api.PhaseActive, Profile: "coder", Backend: units.VLLM}
	gpu1 := api.State{Lane: "GPU 1", GPUs: []int{1}, Phase: api.PhaseActive, Profile: "llama", Backend: units.Ollama,
		Standby: []api.StandbyInfo{{Profile: "llama-big", Mode: "unload"}}}
	tp := api.State{Lane: "GPU 0+1", GPUs: []int{0, 1}, Phase: api.PhaseIdle, LastWanted: "tp", NotServing: "nothing runs although it is wanted"}
	withLanes := func(head api.State, lanes ...api.State) api.State {
		head.Lanes = lanes
		return head
	}
	idle0, idle1 := api.State{Lane: "GPU 0", GPUs: []int{0}, Phase: api.PhaseIdle}, api.State{Lane: "GPU 1", GPUs: []int{1}, Phase: api.PhaseIdle}
	tests := []struct {
		name  string
		state api.State
		lanes []string // per lane: gpus phase profile standby endpoint-healthy line
		hits  [2]int32
		note  string
	}{
		{"three lanes", withLanes(gpu0, gpu0, gpu1, tp), []string{
			"[0] active coder [] true GPU 0: active: coder (vllm)",
			"[1] active llama [llama-big] true GPU 1: active: llama (ollama) · llama-big in standby (unload)",
			"[0 1] idle  [] none GPU 0+1: idle; NOT SERVING: nothing runs although it is wanted",
		}, [2]int32{1, 1}, ""},
		{"GPU 1 serves, GPU 0 idle", withLanes(idle0, idle0, gpu1), []string{
			"[0] idle  [] none GPU 0: idle",
			"[1] active llama [llama-big] true GPU 1: active: llama (ollama) · llama-big in standby (unload)",
		}, [2]int32{0, 1}, ""},
		{"every lane idle", withLanes(idle0, idle0, idle1), []string{"[0] idle  [] none GPU 0: idle", "[1] idle  [] none GPU 1: idle"},
			[2]int32{}, "no inference backend is running on any GPU set"},
		{"one lane", api.State{Phase: api.PhaseActive, Profile: "coder", Backend: units.VLLM}, nil, [2]int32{1, 0}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hits[0].Store(0)
			hits[1].Store(0)
			tools := build(t, connector.Env{Daemon: staticDaemon{api.Status{State: tc.state, Profiles: profiles}}, HTTP: &http.Client{}})
			res := call(t, tools["inference_status"], nil).(StatusResult)
			var got []string
			for _, l := range res.Lanes {
				health := "none"
				if l.Endpoint != nil {
					health = strconv.FormatBool(l.Endpoint.Healthy)
				}
				got = append(got, fmt.Sprintf("%v %s %s %v %s %s", l.GPUs, l.Phase, l.Profile, l.Standby, health, l.Line))
			}
			if strings.Join(got, "\n") != strings.Join(tc.lanes, "\n") {
				t.Errorf("lanes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.lanes, "\n"))
			}
			if h := [2]int32{hits[0].Load(), hits[1].Load()}; h != tc.hits {
				t.Errorf("health probes per backend %v, want %v", h, tc.hits)
			}
			if !strings.Contains(res.Note, tc.note) || (tc.note == "" && res.Note != "") {
				t.Errorf("note %q, want %q", res.Note, tc.note)
			}
			raw, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			if has := strings.Contains(string(raw), `"lanes":`); has != (tc.lanes != nil) {
				t.Errorf("JSON has lanes: %v, want %v: %s", has, tc.lanes != nil, raw)
			}
		})
	}
}
