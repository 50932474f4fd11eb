package appliance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/nvml"
	"gpuhost/systemd"
	"gpuhost/units"
)

// standbyE2EYAML rewrites the end-to-end config for standby on both
// backends: coder (vLLM) `standby: auto` (level 1: the simulated host RAM
// holds its weights), llama (Ollama) `standby: unload`, a watcher every
// 100 ms, and a fast simulated host-device copy (200 GB/s: a level-1
// sleep or wake of coder's ~16 GiB of weights takes ~90 ms) so that dozens
// of switches fit in well under a minute.
func standbyE2EYAML(y string) string {
	y = strings.Replace(y, "  release_timeout: 20s\n", "  release_timeout: 20s\n  standby_watch_interval: 100ms\n", 1)
	// The first profile with this served name is coder (coder-greedy follows).
	y = strings.Replace(y, "    served_name: qwen3-coder\n", "    served_name: qwen3-coder\n    standby: auto\n", 1)
	y = strings.Replace(y, "decode_tps: 500}", "decode_tps: 500, h2d_gbps: 200}", 1)
	y = strings.Replace(y, "    model: llama3.1:8b\n", "    model: llama3.1:8b\n    standby: unload\n", 1)
	return y
}

// holding is one reading of the residual sampler: which backend units hold
// more GPU memory than their measured standby residual (+ tolerance).
type holding struct {
	// Above are the units above residual + tolerance in both of two
	// consecutive NVML snapshots (a reading is not atomic across claims).
	Above    []string          `json:"above"`
	UsedMiB  map[string]uint64 `json:"used_mib"`  // per unit, second snapshot
	LimitMiB map[string]uint64 `json:"limit_mib"` // residual (0 until measured) + tolerance
	// UnattributedMiB is GPU memory held by processes in neither unit.
	UnattributedMiB uint64 `json:"unattributed_mib"`
}

func (h holding) String() string {
	var parts []string
	for u, used := range h.UsedMiB {
		parts = append(parts, fmt.Sprintf("%s %d MiB (limit %d)", u, used, h.LimitMiB[u]))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// residualReport is the residual sampler's report. Instants between an
// "EPISODE START" and an "EPISODE END" (a hand wake_up until the watcher's
// exclusion event) are counted apart: there a second holder is the
// violation the watcher is there to end, not a failure of a switch.
type residualReport struct {
	Samples    int     `json:"samples"`
	Seconds    float64 `json:"seconds"`
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error"`
	// Outside episodes: instants with two holders (must be 0), one, none.
	Both  int    `json:"both"`
	First string `json:"first_violation"`
	One   int    `json:"one"`
	Zero  int    `json:"zero"`
	// Episodes.
	Episodes       int   `json:"episodes"`
	EpisodeSamples int   `json:"episode_samples"`
	EpisodeBoth    int   `json:"episode_both"`
	PerEpisodeBoth []int `json:"per_episode_both"`
	// Samples where some GPU memory belonged to neither backend unit.
	Unattributed      int    `json:"unattributed"`
	FirstUnattributed string `json:"first_unattributed"`
	// The residuals as last read from standby.json.
	ResidualMiB map[string]uint64 `json:"residual_mib"`
}

// samplerAck is the residual sampler's answer to a command.
type samplerAck struct {
	Cmd     string  `json:"cmd"`
	Holding holding `json:"holding"`
	Err     string  `json:"err,omitempty"`
	// For EPISODE END: that episode's samples and two-holder instants.
	EpisodeSamples int `json:"episode_samples"`
	EpisodeBoth    int `json:"episode_both"`
}

// startResidualSampler starts the sampler child in its residual mode: it
// reads both units from systemd (their cgroups), the simulated GPU's
// per-process claims and the residuals the Supervisor measured
// (standby.json), and counts instants where more than one backend holds
// more than its residual.
func startResidualSampler(t testing.TB, e *e2e) *sampler {
	t.Helper()
	vp, op := "", ""
	for name, p := range e.cfg.Profiles {
		if !p.StandbyEnabled() {
			continue
		}
		switch p.Backend {
		case units.VLLM:
			vp = name
		case units.Ollama:
			op = name
		}
	}
	return startSamplerEnv(t, e, "GPUHOST_SAMPLER_MODE=residual",
		"GPUHOST_SAMPLER_PROFILES="+vp+","+op,
		"GPUHOST_SAMPLER_SIMDIR="+e.cfg.GPU.SimDir,
		"GPUHOST_SAMPLER_STANDBY="+filepath.Join(e.cfg.StateDir, "standby.json"))
}

// command sends one line to the residual sampler and waits for its ACK,
// so that what follows happens after the sampler took the command in.
func (s *sampler) command(t testing.TB, cmd string) samplerAck {
	t.Helper()
	if _, err := io.WriteString(s.stdin, cmd+"\n"); err != nil {
		t.Fatalf("sampler command %q: %v", cmd, err)
	}
	for s.out.Scan() {
		if j, ok := strings.CutPrefix(s.out.Text(), "SAMPLER ACK "); ok {
			var a samplerAck
			if err := json.Unmarshal([]byte(j), &a); err != nil {
				t.Fatal(err)
			}
			if a.Cmd != cmd {
				t.Fatalf("sampler acknowledged %q, want %q", a.Cmd, cmd)
			}
			return a
		}
	}
	t.Fatalf("sampler ended without acknowledging %q: %v", cmd, s.out.Err())
	return samplerAck{}
}

// residualSamplerChild is TestSamplerChild with GPUHOST_SAMPLER_MODE=residual.
func residualSamplerChild(t *testing.T) {
	names := strings.Split(os.Getenv("GPUHOST_SAMPLER_UNITS"), ",")
	profiles := strings.Split(os.Getenv("GPUHOST_SAMPLER_PROFILES"), ",")
	if len(names) != 2 || len(profiles) != 2 {
		t.Fatalf("units %q, profiles %q", names, profiles)
	}
	gpu := nvml.NewSim(nvml.SimConfig{Dir: os.Getenv("GPUHOST_SAMPLER_SIMDIR")})
	standbyPath := os.Getenv("GPUHOST_SAMPLER_STANDBY")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := systemd.ConnectPrivate(ctx, "/run/systemd/private")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// The units as systemd loaded them, for the test's Conflicts= check.
	var loaded []api.UnitStatus
	for _, n := range names {
		st, err := m.Unit(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		loaded = append(loaded, st)
	}
	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds) // the test closed stdin: report and end
	}()
	rep := residualReport{ResidualMiB: map[string]uint64{}}
	tolerance := uint64(residualToleranceMiB)

	// above tells which units hold more than their residual in d, by the
	// statuses sts read before the snapshots. A process is unattributed when
	// it is in no unit of either (the statuses read before and after the
	// snapshots): a backend that started in between has no cgroup in the
	// first read. A process that is gone by the time its cgroup is read (it
	// exited after the snapshot) cannot be placed and is not counted.
	above := func(d nvml.Device, sts, either []api.UnitStatus, res map[string]uint64) (map[string]bool, holding) {
		h := holding{UsedMiB: map[string]uint64{}, LimitMiB: map[string]uint64{}}
		out := map[string]bool{}
		for i, st := range sts {
			used := unitUsedMiB(d, st)
			limit := res[profiles[i]] + tolerance
			h.UsedMiB[names[i]], h.LimitMiB[names[i]] = used, limit
			if used > limit {
				out[names[i]] = true
			}
		}
		for _, p := range d.Processes {
			if !systemd.InUnits(p.PID, either...) && systemd.CgroupOf(p.PID) != "" {
				h.UnattributedMiB += p.UsedMiB
			}
		}
		return out, h
	}
	units := func() ([]api.UnitStatus, error) {
		var sts []api.UnitStatus
		for _, n := range names {
			st, err := m.Unit(ctx, n)
			if err != nil {
				return nil, err
			}
			sts = append(sts, st)
		}
		return sts, nil
	}
	measure := func() (holding, error) {
		sts, err := units()
		if err != nil {
			return holding{}, err
		}
		var devs []nvml.Device
		for range 2 {
			snap, err := gpu.Snapshot(ctx)
			if err != nil {
				return holding{}, err
			}
			d, ok := snap.Device0()
			if !ok {
				return holding{}, errors.New("no simulated GPU device")
			}
			devs = append(devs, d)
		}
		// The residuals after the snapshots: a residual is written once,
		// at the first sleep, before the next backend may take memory, so
		// the later read is the one that applies to both snapshots.
		res := map[string]uint64{}
		if data, err := os.ReadFile(standbyPath); err == nil {
			var sf standbyFile
			if err := json.Unmarshal(data, &sf); err != nil {
				return holding{}, fmt.Errorf("standby.json: %w", err)
			}
			res = sf.ResidualMiB
		} else if !errors.Is(err, os.ErrNotExist) {
			return holding{}, err
		}
		rep.ResidualMiB = res
		later, err := units()
		if err != nil {
			return holding{}, err
		}
		either := append(slices.Clone(sts), later...)
		a1, _ := above(devs[0], sts, either, res)
		a2, h := above(devs[1], sts, either, res)
		for _, n := range names {
			if a1[n] && a2[n] {
				h.Above = append(h.Above, n)
			}
		}
		return h, nil
	}
	ack := func(a samplerAck) {
		b, _ := json.Marshal(a)
		fmt.Println("SAMPLER ACK " + string(b))
	}

	b, _ := json.Marshal(loaded)
	fmt.Println("SAMPLER READY " + string(b))
	inEpisode := false
	epSamples, epBoth := 0, 0
	t0 := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case cmd, ok := <-cmds:
			if !ok {
				rep.Seconds = time.Since(t0).Seconds()
				b, _ := json.Marshal(rep)
				fmt.Println("SAMPLER REPORT " + string(b))
				return
			}
			a := samplerAck{Cmd: cmd}
			switch cmd {
			case "EPISODE START":
				inEpisode, epSamples, epBoth = true, 0, 0
				rep.Episodes++
			case "EPISODE END":
				inEpisode = false
				rep.PerEpisodeBoth = append(rep.PerEpisodeBoth, epBoth)
				a.EpisodeSamples, a.EpisodeBoth = epSamples, epBoth
				// What holds the card now that the watcher has acted.
				h, err := measure()
				a.Holding = h
				if err != nil {
					a.Err = err.Error()
				}
			default:
				a.Err = "unknown command"
			}
			ack(a)
			continue
		case <-tick.C:
		}
		h, err := measure()
		if err != nil {
			rep.Errors++
			if rep.FirstError == "" {
				rep.FirstError = err.Error()
			}
			continue
		}
		rep.Samples++
		if h.UnattributedMiB > 0 {
			rep.Unattributed++
			if rep.FirstUnattributed == "" {
				rep.FirstUnattributed = fmt.Sprintf("%d MiB outside both units; %s", h.UnattributedMiB, h)
			}
		}
		if inEpisode {
			rep.EpisodeSamples++
			epSamples++
			if len(h.Above) > 1 {
				rep.EpisodeBoth++
				epBoth++
			}
			continue
		}
		switch len(h.Above) {
		case 0:
			rep.Zero++
		case 1:
			rep.One++
		default:
			rep.Both++
			if rep.First == "" {
				rep.First = h.String()
			}
		}
	}
}

// TestSystemdStandbyExclusion runs standby under a real systemd: units
// rendered without Conflicts=, 50+ switches alternating coder (vLLM, sleeps)
// and llama (Ollama, unloads), hand wake_up calls to the sleeping vLLM
// that the watcher must undo, and a kill -9 of the daemon mid-switch with a
// restart that reads standby.json back. A sampler inside the namespace
// checks throughout that at most one backend holds more than its measured
// residual, apart from the hand wake-ups' episodes, which it counts
// separately.
func TestSystemdStandbyExclusion(t *testing.T) {
	state := t.TempDir()
	e := startE2EWith(t, "100ms", state, standbyE2EYAML, nil)
	vllm, ollama := e.cfg.Backends.VLLM.Unit, e.cfg.Backends.Ollama.Unit
	coder, llama := e.cfg.Profiles["coder"], e.cfg.Profiles["llama"]
	if coder.Standby != units.StandbyAuto || llama.Standby != units.StandbyUnload || coder.Sim.H2DGBps != 200 ||
		e.cfg.GPU.StandbyWatchInterval.D() != 100*time.Millisecond {
		t.Fatalf("config not rewritten for standby: coder %q (h2d %v), llama %q, watch %s",
			coder.Standby, coder.Sim.H2DGBps, llama.Standby, e.cfg.GPU.StandbyWatchInterval.D())
	}

	// The rendered units do not conflict, and neither do the units systemd
	// loaded, read back from it (the sampler's and the daemon's manager).
	for _, bu := range e.cfg.BackendUnits() {
		if !bu.Standby || len(bu.Conflicts) > 0 {
			t.Errorf("backend unit %s rendered with standby %v, conflicts %v", bu.Name, bu.Standby, bu.Conflicts)
		}
		for line := range strings.SplitSeq(units.RenderBackendUnit(bu), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "Conflicts=") {
				t.Errorf("rendered %s has %q", bu.Name, line)
			}
		}
	}
	s := startResidualSampler(t, e)
	var loaded []api.UnitStatus
	if err := json.Unmarshal([]byte(strings.TrimPrefix(s.ready, "SAMPLER READY ")), &loaded); err != nil {
		t.Fatalf("sampler's unit statuses %q: %v", s.ready, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st0, err := e.client.Status(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	noConflict := func(who string, sts []api.UnitStatus) {
		t.Helper()
		seen := 0
		for _, u := range sts {
			other := map[string]string{vllm: ollama, ollama: vllm}[u.Name]
			if other == "" {
				continue
			}
			seen++
			if u.LoadState != "loaded" {
				t.Errorf("%s: %s is %s", who, u.Name, u.LoadState)
			}
			if slices.Contains(u.Conflicts, other) {
				t.Errorf("%s: systemd has %s Conflicts=%v, want no conflict with %s", who, u.Name, u.Conflicts, other)
			}
			t.Logf("%s: systemd has %s Conflicts=%v (fragment %s)", who, u.Name, u.Conflicts, u.FragmentPath)
		}
		if seen != 2 {
			t.Errorf("%s: %d backend units read from systemd, want 2: %+v", who, seen, sts)
		}
	}
	noConflict("sampler's manager", loaded)
	noConflict("daemon's manager", st0.Units)

	lastSeq := func(evs []api.Event) uint64 {
		var n uint64
		for _, ev := range evs {
			n = max(n, ev.Seq)
		}
		return n
	}
	readStandbyFile := func() standbyFile {
		t.Helper()
		var sf standbyFile
		data, err := os.ReadFile(filepath.Join(state, "standby.json"))
		if err != nil {
			t.Fatalf("standby.json: %v", err)
		}
		if err := json.Unmarshal(data, &sf); err != nil {
			t.Fatalf("standby.json: %v", err)
		}
		return sf
	}
	inStandby := func(st api.State, profile string) (api.StandbyInfo, bool) {
		for _, sb := range st.Standby {
			if sb.Profile == profile {
				return sb, true
			}
		}
		return api.StandbyInfo{}, false
	}

	// One hand wake_up of the sleeping vLLM while llama is active: the
	// watcher must find it above its residual and put it back to sleep.
	type episode struct {
		usedMiB, residualMiB float64
		samples, both        int
	}
	var episodes []episode
	handWake := func(since uint64) {
		t.Helper()
		s.command(t, "EPISODE START")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// As root on the box: the backend's port is in its private
		// network, so the hand wake goes through the unit's socket.
		sock := units.ProxySocketPath(e.cfg.Backends.VLLM.Unit, coder.Port)
		if out, err := e.sd.Command(ctx, "curl", "-sS", "--fail", "--max-time", "10", "-X", "POST",
			"--unix-socket", sock, "http://localhost/wake_up").CombinedOutput(); err != nil {
			t.Fatalf("hand wake_up through %s: %v %s", sock, err, out)
		}
		var ex *api.Event
		var seen []api.Event
		err = e.client.Events(ctx, fmt.Sprintf("/api/events?since=%d", since), func(ev api.Event) bool {
			seen = append(seen, ev)
			if ev.Kind == "exclusion" {
				ex = &ev
				return false
			}
			return true
		})
		end := s.command(t, "EPISODE END")
		if ex == nil {
			t.Fatalf("no exclusion event after a hand wake_up of %s (%v):%s", vllm, err, describe(seen))
		}
		if !strings.Contains(ex.Message, "put back into standby") || ex.Detail["unit"] != vllm || ex.Profile != "coder" {
			t.Errorf("exclusion event after the hand wake_up: %s %+v", ex.Message, ex.Detail)
		}
		used, _ := ex.Detail["used_mib"].(float64)
		res, _ := ex.Detail["residual_mib"].(float64)
		if used <= res+residualToleranceMiB {
			t.Errorf("exclusion event with %v MiB used, residual %v MiB: not above it", used, res)
		}
		if end.Err != "" || slices.Contains(end.Holding.Above, vllm) || len(end.Holding.Above) > 1 {
			t.Errorf("after the exclusion event: above residual %v (%s), err %q", end.Holding.Above, end.Holding, end.Err)
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel2()
		st, err := e.client.Status(ctx2)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := inStandby(st.State, "coder"); st.State.Phase != api.PhaseActive || st.State.Profile != "llama" || !ok {
			t.Errorf("state after the watcher: %+v", st.State)
		}
		episodes = append(episodes, episode{used, res, end.EpisodeSamples, end.EpisodeBoth})
	}

	// A switch to llama whose daemon is killed (SIGKILL, the main process
	// only) once its standby step has started, then started again at
	// once as TestSystemdKillDuringSlowStop does. It reports whether the
	// killed daemon had not finished the switch (no "switch done" seen).
	type killResult struct {
		mid       bool
		lastStep  string
		reconcile string
		atReady   api.State
	}
	killMidSwitch := func() killResult {
		t.Helper()
		var kr killResult
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		residualBefore := readStandbyFile().ResidualMiB
		acc, err := e.client.Switch(ctx, api.SwitchRequest{Profile: "llama"})
		if err != nil {
			t.Fatal(err)
		}
		evc := make(chan api.Event, 1024)
		streamDone := make(chan struct{})
		go func() {
			defer close(streamDone)
			_ = e.client.Events(ctx, acc.Events, func(ev api.Event) bool {
				evc <- ev
				return !(ev.Kind == "switch" && ev.SwitchID == acc.SwitchID && (ev.Status == "done" || ev.Status == "failed"))
			})
		}()
		var seen []api.Event
	wait:
		for {
			select {
			case ev := <-evc:
				seen = append(seen, ev)
				if ev.Kind == "step" && ev.Step == "standby" && ev.Status == "started" {
					break wait
				}
			case <-streamDone:
				t.Fatalf("the switch's events ended before its standby step:%s", describe(seen))
			}
		}
		if out, err := e.sd.Systemctl(ctx, "kill", "--kill-whom=main", "--signal=KILL", "gpuhost.service"); err != nil {
			t.Fatalf("kill gpuhost: %v %s", err, out)
		}
		select {
		case <-streamDone:
		case <-ctx.Done():
			t.Fatal("the killed daemon's event stream did not end")
		}
		for drained := false; !drained; {
			select {
			case ev := <-evc:
				seen = append(seen, ev)
			default:
				drained = true
			}
		}
		kr.mid = true
		for _, ev := range seen {
			if ev.Kind == "step" && ev.Status == "started" {
				kr.lastStep = ev.Step
			}
			if ev.Kind == "switch" && ev.SwitchID == acc.SwitchID && (ev.Status == "done" || ev.Status == "failed") {
				kr.mid = false
			}
		}
		for e.isActive(t, "gpuhost.service") == "active" {
			if ctx.Err() != nil {
				t.Fatal("gpuhost.service survived SIGKILL")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if out, err := e.sd.Systemctl(ctx, "start", "gpuhost.service"); err != nil {
			t.Fatalf("restart gpuhost: %v %s", err, out)
		}
		// READY=1 came once the restarted daemon had read standby.json,
		// reconciled and started its restore switch.
		st, err := e.client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kr.atReady = st.State
		if st.State.Phase == api.PhaseFailed || strings.Contains(st.State.Error, "two backends") {
			t.Errorf("right after the restart the state is %+v", st.State)
		}
		final := e.waitState(t, "llama active after the restart", 60*time.Second, func(s api.Status) bool {
			return s.State.Phase == api.PhaseActive && s.State.Profile == "llama" && s.State.Step == "" ||
				s.State.Phase != api.PhaseSwitching && s.State.Step == "" && s.State.Phase != api.PhaseActive
		})
		if final.State.Phase != api.PhaseActive || final.State.Profile != "llama" {
			t.Fatalf("after the restart the box settled %+v, want llama active", final.State)
		}
		if sb, ok := inStandby(final.State, "coder"); !ok || sb.Unit != vllm || sb.ResidualMiB != residualBefore["coder"] {
			t.Errorf("after the restart coder's standby is %+v (found %v), want %s at the persisted residual %d MiB",
				sb, ok, vllm, residualBefore["coder"])
		}
		// The restarted daemon's events from its start: never two backends
		// active, and its restore switch done.
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		var revs []api.Event
		restored := false
		_ = e.client.Events(rctx, "/api/events?since=0", func(ev api.Event) bool {
			revs = append(revs, ev)
			if ev.Kind == "reconcile" && kr.reconcile == "" {
				kr.reconcile = ev.Message
			}
			if ev.Kind == "switch" && (ev.Status == "done" || ev.Status == "failed") {
				restored = ev.Status == "done"
				return false
			}
			return true
		})
		for _, ev := range revs {
			if strings.Contains(ev.Message, "two backends") || ev.Kind == "state" && ev.Detail["phase"] == string(api.PhaseFailed) {
				t.Errorf("the restarted daemon reported %s %q", ev.Kind, ev.Message)
			}
		}
		if !restored {
			t.Errorf("the restarted daemon's restore switch did not finish:%s", describe(revs))
		}
		for _, u := range []string{vllm, ollama} {
			if got := e.isActive(t, u); got != "active" {
				t.Errorf("%s is %s after the restart, want active (one serving, one in standby)", u, got)
			}
		}
		return kr
	}

	const total = 52
	handWakesAt := map[int]bool{5: true, 15: true, 35: true, 45: true}
	killFrom, killTries := 25, 3
	var kills []killResult
	killedMid := false
	switches := 0
	for i := range total {
		p := "coder"
		if i%2 == 1 {
			p = "llama"
		}
		if p == "llama" && i >= killFrom && !killedMid && len(kills) < killTries {
			kr := killMidSwitch()
			kills = append(kills, kr)
			killedMid = kr.mid
			switches++
			continue
		}
		evs := e.switchTo(t, p)
		switches++
		if last := evs[len(evs)-1]; last.Kind != "switch" || last.Status != "done" {
			t.Fatalf("switch %d to %s ended with %s %s:%s", i, p, last.Kind, last.Status, describe(evs))
		}
		// From the third switch on both units run: every switch puts one
		// in standby and wakes the other, never starts or stops a unit.
		if got := strings.Join(stepsOf(evs), " "); i >= 2 && got != "drain standby wake ready verify wake_check" {
			t.Errorf("switch %d to %s steps = %q, want a drain, a standby and a wake", i, p, got)
		}
		if handWakesAt[i] {
			handWake(lastSeq(evs))
		}
	}
	rep := residualReport{}
	s.stopInto(t, &rep)

	for _, kr := range kills {
		t.Logf("kill -9 at the standby step of a switch to llama: mid-switch %v (last step started: %s); at READY %s %s/%s; restarted daemon: %q",
			kr.mid, kr.lastStep, kr.atReady.Phase, kr.atReady.Profile, kr.atReady.Target, kr.reconcile)
	}
	if !killedMid {
		t.Errorf("none of %d kills landed before the switch was done", len(kills))
	}
	hz := 0.0
	if rep.Seconds > 0 {
		hz = float64(rep.Samples) / rep.Seconds
	}
	t.Logf("switches: %d (%d by a restarted daemon); residuals (standby.json): %v", switches, len(kills), rep.ResidualMiB)
	t.Logf("sampler: %d samples in %.1f s (%.0f Hz), %d errors; outside episodes: %d instants with two holders above residual, %d with one, %d with none",
		rep.Samples, rep.Seconds, hz, rep.Errors, rep.Both, rep.One, rep.Zero)
	t.Logf("exclusion episodes: %d hand wake_up, %d samples within them, %d instants with two holders (per episode %v)",
		rep.Episodes, rep.EpisodeSamples, rep.EpisodeBoth, rep.PerEpisodeBoth)
	for i, ep := range episodes {
		t.Logf("episode %d: the watcher found coder at %.0f MiB (residual %.0f), put it back; sampler: %d samples, %d with two holders",
			i+1, ep.usedMiB, ep.residualMiB, ep.samples, ep.both)
	}

	if switches < 50 {
		t.Errorf("%d switches, want ≥ 50", switches)
	}
	if rep.Both != 0 {
		t.Errorf("outside the hand wake-ups, %d instants with two backends above their residual; first: %s", rep.Both, rep.First)
	}
	if rep.Episodes != len(handWakesAt) || len(episodes) != len(handWakesAt) {
		t.Errorf("%d episodes in the sampler, %d exclusions seen, want %d", rep.Episodes, len(episodes), len(handWakesAt))
	}
	if rep.Errors > 0 {
		t.Errorf("sampler had %d errors, first: %s", rep.Errors, rep.FirstError)
	}
	if rep.Unattributed > 0 {
		t.Errorf("%d samples with GPU memory outside both units, first: %s", rep.Unattributed, rep.FirstUnattributed)
	}
	// The sampler must have seen the serving backend as a holder (else its
	// attribution of processes to units would be broken and 0 meaningless).
	if rep.One == 0 {
		t.Errorf("the sampler never saw a backend above its residual: %+v", rep)
	}
	if r, ok := rep.ResidualMiB["coder"]; !ok || r == 0 || r > 1024 {
		t.Errorf("coder's residual in standby.json = %d (%v), want the simulator's 512", r, ok)
	}
	if _, ok := rep.ResidualMiB["llama"]; !ok {
		t.Errorf("llama's residual not measured: %v", rep.ResidualMiB)
	}
	// The last switch was to llama: coder in standby, both units up.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := inStandby(st.State, "coder"); st.State.Phase != api.PhaseActive || st.State.Profile != "llama" || !ok || len(st.State.Standby) != 1 {
		t.Errorf("final state %+v", st.State)
	}
	// Both backends run: neither port answers from the host's namespace,
	// the sleeping vLLM's /wake_up included, and /v1 still serves llama.
	e.backendOnlyThroughGpuhost(t, "llama")
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(coder.Port)), 5*time.Second); err == nil {
		c.Close()
		t.Errorf("the standby vLLM's port %d answers TCP from the host namespace", coder.Port)
	}
}
