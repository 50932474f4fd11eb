package panel

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// laneBoxEnv is the panel on a real box of three lanes, built as the
// daemon builds it (appliance.NewBox) on two simulated RTX 4090s: GPU 0
// (coder, coder-greedy, coder-slow: coder loading for 3 s), GPU 1 (llama
// and llama2, two Ollama profiles) and GPU 0+1 (coder-tp, coder tensor
// parallel over both). The profiles in activate are switched to, in
// order, before it returns.
func laneBoxEnv(t *testing.T, activate ...string) *env {
	t.Helper()
	bin := testbin.Binary(t)
	state := t.TempDir()
	cfg, err := config.Parse("panel-lanes", []byte(testbin.ConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms")))
	if err != nil {
		t.Fatal(err)
	}
	*cfg.Switch.RestoreOnBoot = false
	cfg.GPU.Sim.Devices = make([]config.SimGPUDevice, 2)
	copyOf := func(from, name, served string, gpus []int) *units.Profile {
		p := *cfg.Profiles[from]
		p.Name, p.ServedName, p.GPUs = name, served, units.GPUSet{Indices: gpus, Given: true}
		cfg.Profiles[name] = &p
		return &p
	}
	cfg.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
	copyOf("llama", "llama2", "llama3.2:3b", []int{1}).Model = "llama3.2:3b"
	copyOf("coder", "coder-slow", "qwen3-coder-slow", []int{0}).Sim.LoadTime = "3s"
	copyOf("coder", "coder-tp", "qwen3-coder-tp", []int{0, 1}).Port = testkit.FreePort(t)
	if n := len(cfg.Lanes()); n != 3 {
		t.Fatalf("%d lanes, want 3", n)
	}
	gpu, closeGPU, err := appliance.OpenGPU(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, journal, closeUnits, err := appliance.OpenUnits(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	box := appliance.NewBox(cfg, gpu, u, journal, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = box.Run(ctx); close(done) }()
	ev := &env{box: box}
	t.Cleanup(func() {
		cancel()
		<-done
		box.Close()
		closeUnits()
		closeGPU()
	})
	<-box.Ready()
	doctor := func(ctx context.Context, profile string) api.DoctorReport {
		return (&appliance.Doctor{Cfg: cfg, GPU: gpu, Units: u, Profile: profile, Gate: box,
			LaneGate: func(l config.Lane) appliance.ProbeGate { return box.Lane(l.Slot) }}).Run(ctx)
	}
	httpAPI, err := httpapi.New(box, doctor, log)
	if err != nil {
		t.Fatal(err)
	}
	d := testDaemon(cfg)
	d.Journal = JournalFunc(journal)
	if ev.p, err = New(box, doctor, d, log); err != nil {
		t.Fatal(err)
	}
	ev.p.Register(httpAPI)
	ev.srv = httptest.NewServer(httpAPI)
	t.Cleanup(func() {
		ev.srv.CloseClientConnections()
		ev.srv.Close()
	})
	for _, p := range activate {
		boxSwitch(t, box, p)
	}
	return ev
}

// boxSwitch runs a switch on the box to its end.
func boxSwitch(t *testing.T, box *appliance.Box, profile string) {
	t.Helper()
	_, done, err := box.Switch(context.Background(), profile, api.SwitchOptions{Force: true})
	if err != nil {
		t.Fatalf("switch to %s: %v", profile, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("switch to %s: %v", profile, err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("switch to %s did not end in 60 s", profile)
	}
}

// laneState is the state of the lane named name.
func laneState(t *testing.T, box *appliance.Box, name string) api.State {
	t.Helper()
	for _, l := range box.State().Lanes {
		if l.Lane == name {
			return l
		}
	}
	t.Fatalf("no lane %s in %+v", name, box.State())
	return api.State{}
}

// On a real box of several lanes the profiles page marks each lane's
// active profile and gives every row its lane's GPUs; each GPU's card
// on the dashboard says what the lanes on it serve; the pill names each
// lane that serves; and a switch on GPU 1 from the panel takes the
// "VRAM released" figure from GPU 1, not GPU 0.
func TestLanesOnRealBox(t *testing.T) {
	ev := laneBoxEnv(t, "coder", "llama")
	c := ev.client(t)

	_, page := do(t, c, http.MethodGet, ev.srv.URL+"/profiles", nil, nil)
	if !strings.Contains(page, `<table class="profiles" data-lanes="true">`) {
		t.Errorf("profiles table not in lanes mode:\n%s", page)
	}
	for _, row := range []struct{ name, gpus, class string }{
		{"coder", "0", ` class="active"`}, {"coder-greedy", "0", ""}, {"coder-slow", "0", ""},
		{"llama", "1", ` class="active"`}, {"llama2", "1", ""}, {"coder-tp", "0,1", ""},
	} {
		want := `<tr data-profile="` + row.name + `" data-backend="`
		at := strings.Index(page, want)
		if at < 0 {
			t.Errorf("no row %s", row.name)
			continue
		}
		tag := page[at : at+strings.Index(page[at:], ">")+1]
		if !strings.Contains(tag, `data-lane-gpus="`+row.gpus+`"`+row.class+`>`) {
			t.Errorf("row %s: %s, want lane GPUs %s and class %q", row.name, tag, row.gpus, row.class)
		}
	}

	_, dash := do(t, c, http.MethodGet, ev.srv.URL+"/", nil, nil)
	for id, lines := range map[string][]string{
		"gpu-0": {`<div class="lane-line lane-active" data-lane="GPU 0">GPU 0: active: coder (vllm)</div>`,
			`<div class="lane-line lane-idle" data-lane="GPU 0&#43;1">GPU 0&#43;1: idle</div>`},
		"gpu-1": {`<div class="lane-line lane-active" data-lane="GPU 1">GPU 1: active: llama (ollama)</div>`,
			`<div class="lane-line lane-idle" data-lane="GPU 0&#43;1">GPU 0&#43;1: idle</div>`},
	} {
		sec := element(dash, `<section class="card lane" id="`+id+`"`)
		for _, l := range lines {
			if !strings.Contains(sec, l) {
				t.Errorf("%s lacks %q:\n%s", id, l, sec)
			}
		}
	}
	if strings.Contains(element(dash, `<section class="card lane" id="gpu-0"`), `data-lane="GPU 1"`) {
		t.Error("GPU 0's card shows GPU 1's lane")
	}

	_, live := do(t, c, http.MethodGet, ev.srv.URL+"/live", nil, map[string]string{"Accept": "application/json"})
	var ans liveAnswer
	if err := json.Unmarshal([]byte(live), &ans); err != nil {
		t.Fatal(err)
	}
	if ans.Pill != "GPU 0: coder · vllm | GPU 1: llama · ollama" || ans.PillClass != "active" {
		t.Errorf("pill %q class %q", ans.Pill, ans.PillClass)
	}

	resp, body := do(t, c, http.MethodPost, ev.srv.URL+"/switch", url.Values{"csrf": {csrfOf(t, page)}, "profile": {"llama2"}},
		map[string]string{"Accept": "application/json"})
	var acc switchAccepted
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal([]byte(body), &acc) != nil {
		t.Fatalf("switch to llama2: %d %s", resp.StatusCode, body)
	}
	// GPU 1 held llama's 6200 MiB; GPU 0 holds coder's 0.92 of 24 GiB.
	if acc.BeforeMiB < 6200 || acc.BeforeMiB > 7000 {
		t.Errorf("before_mib %d: not GPU 1's memory (llama's 6200 MiB)", acc.BeforeMiB)
	}
	if !testkit.Poll(60*time.Second, func() bool { return laneState(t, ev.box, "GPU 1").Profile == "llama2" }) {
		t.Fatalf("GPU 1's lane did not switch to llama2: %+v", laneState(t, ev.box, "GPU 1"))
	}
	if st := laneState(t, ev.box, "GPU 0"); st.Profile != "coder" {
		t.Errorf("GPU 0's lane after the switch on GPU 1: %+v", st)
	}
}

// The progress of a switch is built from its own events only, and it
// runs while any lane runs it: a switch on GPU 1 is not "lost from the
// buffer" because GPU 0's lane is not switching, and the events of a
// switch on another lane at the same time do not enter it.
func TestProgressPerLane(t *testing.T) {
	ev := func(id string, kind api.EventKind, step string, status api.EventStatus, profile string) api.Event {
		return api.Event{SwitchID: id, Kind: kind, Step: step, Status: status, Profile: profile}
	}
	events := []api.Event{
		ev("a", api.EventSwitch, "", api.StatusStarted, "llama2"),
		ev("b", api.EventSwitch, "", api.StatusStarted, "coder-slow"),
		ev("a", api.EventStep, api.StepStop, api.StatusDone, ""),
		ev("b", api.EventStep, api.StepStop, api.StatusDone, ""),
		ev("b", api.EventSwitch, "", api.StatusInfo, "coder-slow"),
		ev("a", api.EventStep, api.StepStart, api.StatusStarted, ""),
	}
	for i := range events {
		events[i].Seq = uint64(i + 1)
	}
	gpu0 := api.State{Lane: "GPU 0", Phase: api.PhaseSwitching, SwitchID: "b"}
	gpu1 := api.State{Lane: "GPU 1", Phase: api.PhaseSwitching, SwitchID: "a"}
	lanes := gpu0
	lanes.Lanes = []api.State{gpu0, gpu1}
	tests := []struct {
		name    string
		id      string
		current api.State
		running bool
		steps   string
		outcome string
	}{
		{"GPU 1's switch while GPU 0 switches too", "a", lanes, true, "stop:done start:running", ""},
		{"GPU 0's switch", "b", lanes, true, "stop:done info:info", ""},
		{"GPU 1's switch on a box that no longer runs it", "a", gpu0, false, "stop:done start:running", "unknown"},
		{"one lane, its own switch", "b", api.State{Phase: api.PhaseSwitching, SwitchID: "b"}, true, "stop:done info:info", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pv := buildProgress(tc.id, events, -1, tc.current)
			var steps []string
			for _, s := range pv.Steps {
				steps = append(steps, s.Step+":"+s.Status)
			}
			if pv.Running != tc.running || strings.Join(steps, " ") != tc.steps || pv.Outcome != tc.outcome {
				t.Errorf("running %v steps %q outcome %q; want %v %q %q", pv.Running, steps, pv.Outcome, tc.running, tc.steps, tc.outcome)
			}
		})
	}
	if got := runningSwitch(api.State{Phase: api.PhaseIdle, Lanes: []api.State{{Phase: api.PhaseIdle}, gpu1}}); got != "a" {
		t.Errorf("runningSwitch with GPU 1 switching: %q, want a", got)
	}
}

// The header pill on a box of several lanes names each lane that is not
// idle, and the worst lane colours it; a box of one lane keeps its pill.
func TestPillPerLane(t *testing.T) {
	active := func(lane, profile string) api.State {
		return api.State{Lane: lane, Phase: api.PhaseActive, Profile: profile, Backend: units.VLLM}
	}
	idle := func(lane string) api.State { return api.State{Lane: lane, Phase: api.PhaseIdle} }
	box := func(lanes ...api.State) api.State {
		st := lanes[0]
		st.Lanes = lanes
		return st
	}
	switching := api.State{Lane: "GPU 1", Phase: api.PhaseSwitching, Target: "llama2", Step: api.StepStart}
	notServing := idle("GPU 0+1")
	notServing.LastWanted, notServing.NotServing = "coder-tp", "crash loop"
	tests := []struct {
		name        string
		st          api.State
		line, class string
	}{
		{"one lane", active("", "coder"), "coder · vllm", "active"},
		{"two serve", box(active("GPU 0", "coder"), active("GPU 1", "llama"), idle("GPU 0+1")), "GPU 0: coder · vllm | GPU 1: llama · vllm", "active"},
		{"one switches", box(active("GPU 0", "coder"), switching), "GPU 0: coder · vllm | GPU 1: switching to llama2 · start", "switching"},
		{"all idle", box(idle("GPU 0"), idle("GPU 1")), "idle", "idle"},
		{"one does not serve", box(idle("GPU 0"), active("GPU 1", "llama"), notServing),
			"GPU 1: llama · vllm | GPU 0+1: not serving coder-tp · idle", "failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := phaseLine(tc.st); got != tc.line {
				t.Errorf("phaseLine = %q, want %q", got, tc.line)
			}
			if got := pillClass(tc.st); got != tc.class {
				t.Errorf("pillClass = %q, want %q", got, tc.class)
			}
		})
	}
}

// The doctor's verdicts are read again when any lane changes, not only
// GPU 0's.
func TestStateKeyPerLane(t *testing.T) {
	box := func(gpu1 string) api.State {
		gpu0 := api.State{Lane: "GPU 0", Phase: api.PhaseActive, Profile: "coder"}
		st := gpu0
		st.Lanes = []api.State{gpu0, {Lane: "GPU 1", Phase: api.PhaseActive, Profile: gpu1}}
		return st
	}
	tests := []struct {
		name string
		a, b api.State
		same bool
	}{
		{"GPU 1 switched", box("llama"), box("llama2"), false},
		{"nothing changed", box("llama"), box("llama"), true},
		{"one lane", api.State{Phase: api.PhaseActive, Profile: "coder"}, api.State{Phase: api.PhaseActive, Profile: "coder"}, true},
		{"one lane switched", api.State{Phase: api.PhaseActive, Profile: "coder"}, api.State{Phase: api.PhaseActive, Profile: "llama"}, false},
	}
	for _, tc := range tests {
		if same := stateKey(tc.a) == stateKey(tc.b); same != tc.same {
			t.Errorf("%s: same key %v, want %v (%q, %q)", tc.name, same, tc.same, stateKey(tc.a), stateKey(tc.b))
		}
	}
}

// Each GPU lists the lanes on it, its own first, each with its line and
// colour; a lane that switches links to its switch's progress.
func TestServingOn(t *testing.T) {
	st := api.State{Lanes: []api.State{
		{Lane: "GPU 0", GPUs: []int{0}, Phase: api.PhaseSwitching, Target: "gemma", Step: api.StepStop, SwitchID: "s0"},
		{Lane: "GPU 0+1", GPUs: []int{0, 1}, Phase: api.PhaseIdle, LastWanted: "tp", NotServing: "crash loop"},
		{Lane: "GPU 1", GPUs: []int{1}, Phase: api.PhaseActive, Profile: "llama", Backend: units.Ollama},
	}}
	tests := []struct {
		gpu  int
		want string
	}{
		{0, "switching GPU 0: switching to gemma: stop s0 | failed GPU 0+1: idle; NOT SERVING: crash loop "},
		{1, "active GPU 1: active: llama (ollama)  | failed GPU 0+1: idle; NOT SERVING: crash loop "},
		{2, ""},
	}
	for _, tc := range tests {
		var got []string
		for _, l := range servingOn(st, tc.gpu) {
			got = append(got, l.Class+" "+l.Line+" "+l.SwitchID)
		}
		if strings.Join(got, " | ") != tc.want {
			t.Errorf("GPU %d: %q, want %q", tc.gpu, strings.Join(got, " | "), tc.want)
		}
	}
	if got := servingOn(api.State{Phase: api.PhaseActive, Profile: "coder"}, 0); got != nil {
		t.Errorf("a box of one lane: %v, want none", got)
	}
}
