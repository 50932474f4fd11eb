package appliance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/loopback"
	"gpuhost/systemd"
)

// BenchmarkSwitchOverhead measures what gpuhost adds to a switch: the wall
// time of `POST /api/switch` (wait) against the bare time of the same work
// done directly over D-Bus in the same private systemd (stop the old unit,
// start the new one, poll its health every millisecond until it answers,
// and for Ollama load the model). The bare side then asks the engine the
// known prompt gpuhost's check asks after a cold start, outside its total:
// gpuhost's overhead beyond that answer is what it adds besides the
// engine's own decoding. One private systemd serves every case and
// every round (the cases are profiles of it: coder starts at once,
// coder-slow loads for 1.5 s); each round measures both sides from the
// same starting state, alternating which goes first. It reports medians of
// the paired runs and logs each step's median beside the bare path's and
// the host's load. Run with `make bench`; needs root (private systemd).
func BenchmarkSwitchOverhead(b *testing.B) {
	e := startE2EWith(b, "0s", b.TempDir(), withSlowCoder, benchDropIns())
	e.switchTo(b, "coder-slow") // writes both env files via a round trip
	e.switchTo(b, "llama")
	e.switchTo(b, "coder")
	bare := startBare(b, e)
	defer bare.close()
	for _, c := range []struct{ name, vllm string }{{"vllm_load=0s", "coder"}, {"vllm_load=1500ms", "coder-slow"}} {
		b.Run(c.name, func(b *testing.B) {
			ob := &overheadBench{e: e, bare: bare, steps: map[string][]time.Duration{}}
			load0 := loadAvg()
			e.switchTo(b, c.vllm)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for dir, p := range []string{"llama", c.vllm} {
					back := map[bool]string{true: c.vllm, false: "llama"}[p == "llama"]
					ob.pair(b, dir, p, back, i%2 == 1)
				}
			}
			b.StopTimer()
			ob.report(b, load0, loadAvg())
		})
	}
}

// withSlowCoder adds coder-slow: the coder profile on the same unit and
// port with a simulated load of 1.5 s.
func withSlowCoder(yaml string) string {
	i := strings.Index(yaml, "  coder-greedy:")
	coder := yaml[strings.Index(yaml, "  coder:"):i]
	slow := strings.Replace(coder, "  coder:", "  coder-slow:", 1)
	slow = strings.Replace(slow, "load_time: 0s", "load_time: 1500ms", 1)
	return yaml[:i] + slow + yaml[i:]
}

// benchDropIns lifts systemd's start rate limit (5 starts in 10 s) from the
// backend units: a benchmark round starts each unit three times within a
// second or two, which a box never does, and a start refused by the limit
// would fail the switch on both sides.
func benchDropIns() map[string]string {
	d := "[Unit]\nStartLimitIntervalSec=0\n"
	return map[string]string{"gpuhost-vllm.service.d/bench.conf": d, "gpuhost-ollama.service.d/bench.conf": d}
}

// overheadBench collects one case's paired runs: index 0 is the switch to
// Ollama, 1 the switch to vLLM.
type overheadBench struct {
	e              *e2e
	bare           *bareSwitcher
	gpuhost, bareD [2][]time.Duration
	server         [2][]time.Duration // the switch's own duration (its done event)
	bareSteps      [2]map[string][]time.Duration
	steps          map[string][]time.Duration // "dir/step" → gpuhost's step durations
}

// pair measures one switch to p on both sides from the same state (back
// active), the bare one first when bareFirst.
func (o *overheadBench) pair(b *testing.B, dir int, p, back string, bareFirst bool) {
	sides := []func(){
		func() {
			d, server, steps := o.e.timedSwitch(b, p)
			o.gpuhost[dir] = append(o.gpuhost[dir], d)
			o.server[dir] = append(o.server[dir], server)
			for k, v := range steps {
				o.steps[fmt.Sprint(dir, "/", k)] = append(o.steps[fmt.Sprint(dir, "/", k)], v)
			}
		},
		func() {
			d, split := o.bare.switchTo(b, p)
			o.bareD[dir] = append(o.bareD[dir], d)
			if o.bareSteps[dir] == nil {
				o.bareSteps[dir] = map[string][]time.Duration{}
			}
			for k, v := range split {
				o.bareSteps[dir][k] = append(o.bareSteps[dir][k], v)
			}
			o.e.waitState(b, "reconciled after the bare switch", 10*time.Second, func(s api.Status) bool {
				return s.State.Phase == api.PhaseActive && s.State.Profile == p
			})
		},
	}
	if bareFirst {
		sides[0], sides[1] = sides[1], sides[0]
	}
	sides[0]()
	// Back to the same start without measuring, then the other side.
	o.e.timedSwitch(b, back)
	sides[1]()
}

// report states the medians: per direction the two sides and the paired
// overhead as metrics, and in the log each step beside the bare path's.
func (o *overheadBench) report(b *testing.B, load0, load1 string) {
	for dir, name := range []string{"ollama", "vllm"} {
		// diffs: against the bare start, ready poll (and load); beyond:
		// against the same plus the known prompt's answer asked directly,
		// which leaves what gpuhost adds besides the engine's own decode.
		diffs := make([]time.Duration, len(o.gpuhost[dir]))
		beyond := make([]time.Duration, len(o.gpuhost[dir]))
		answer := o.bareSteps[dir][api.StepWakeCheck]
		for i := range diffs {
			diffs[i] = o.gpuhost[dir][i] - o.bareD[dir][i]
			beyond[i] = diffs[i] - answer[i]
		}
		b.ReportMetric(medianMS(o.bareD[dir]), "bare_to_"+name+"_ms")
		b.ReportMetric(medianMS(o.gpuhost[dir]), "gpuhost_to_"+name+"_ms")
		b.ReportMetric(medianMS(diffs), "overhead_to_"+name+"_ms")
		b.ReportMetric(medianMS(beyond), "beyond_answer_to_"+name+"_ms")
		var lines []string
		for _, st := range api.Steps() {
			if ds, ok := o.steps[fmt.Sprint(dir, "/", st)]; ok {
				line := fmt.Sprintf("%s %.1f", st, medianMS(ds))
				if bs, ok := o.bareSteps[dir][st]; ok {
					line += fmt.Sprintf(" (bare %.1f)", medianMS(bs))
				}
				lines = append(lines, line)
			}
		}
		b.Logf("→ %s, medians of %d paired runs: bare %.1f ms, gpuhost %.1f ms (switch itself %.1f ms, HTTP and pre-switch checks %.1f ms), overhead %.1f ms; the engine's answer to the known prompt asked directly %.1f ms, overhead beyond it %.1f ms; steps ms: %s",
			name, len(diffs), medianMS(o.bareD[dir]), medianMS(o.gpuhost[dir]), medianMS(o.server[dir]),
			medianMS(o.gpuhost[dir])-medianMS(o.server[dir]), medianMS(diffs), medianMS(answer), medianMS(beyond), strings.Join(lines, ", "))
	}
	b.Logf("load average (/proc/loadavg) before: %s; after: %s", load0, load1)
	b.ReportMetric(0, "ns/op")
}

func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// timedSwitch is a switch through POST /api/switch with wait: its wall
// time, the switch's own duration and its steps' (from its events).
func (e *e2e) timedSwitch(b testing.TB, profile string) (time.Duration, time.Duration, map[string]time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	acc, err := e.client.Switch(ctx, api.SwitchRequest{Profile: profile, Wait: true})
	d := time.Since(t0)
	if err != nil || acc.State == nil || acc.State.Profile != profile {
		for _, u := range []string{e.cfg.Backends.VLLM.Unit, e.cfg.Backends.Ollama.Unit} {
			out, _ := e.sd.Systemctl(ctx, "status", "--no-pager", "-n", "20", u)
			b.Log(out)
		}
		b.Fatalf("switch to %s: %v %+v", profile, err, acc.State)
	}
	var server time.Duration
	steps := map[string]time.Duration{}
	_ = e.client.Events(ctx, acc.Events, func(ev api.Event) bool {
		if ev.SwitchID != acc.SwitchID {
			return true
		}
		ms := time.Duration(ev.DurationMS * float64(time.Millisecond))
		if ev.Kind == api.EventStep && ev.Status == api.StatusDone {
			steps[ev.Step] += ms
		}
		if ev.Kind == api.EventSwitch && ev.Status == api.StatusDone {
			server = ms
			return false
		}
		return true
	})
	return d, server, steps
}

// bareSwitcher is a child process inside the private systemd's PID
// namespace that performs bare switches on request (stdin: profile name,
// stdout: elapsed microseconds), so no process start is measured.
type bareSwitcher struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	cfg *config.Config
}

func startBare(b testing.TB, e *e2e) *bareSwitcher {
	exe, _ := os.Executable()
	cmd := e.sd.Command(context.Background(), exe, "-test.run=^TestBareSwitchChild$", "-test.v")
	spec := fmt.Sprintf("%s %d %s %d %s %s", e.cfg.Backends.VLLM.Unit, e.cfg.Profiles["coder"].Port,
		e.cfg.Backends.Ollama.Unit, e.cfg.Profiles["llama"].Port, e.cfg.Profiles["llama"].Model, e.cfg.Profiles["coder"].ServedModelName())
	// The backends are fenced in their own network: the bare switcher
	// reaches them through their sockets, as gpuhost does.
	var socks []string
	for port, path := range e.cfg.BackendSockets() {
		socks = append(socks, fmt.Sprintf("%d=%s", port, path))
	}
	cmd.Env = append(os.Environ(), "GPUHOST_BARE="+spec, "GPUHOST_BARE_SOCKETS="+strings.Join(socks, ","))
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &bareSwitcher{cmd: cmd, in: in, out: bufio.NewScanner(out), cfg: e.cfg}
	for s.out.Scan() {
		if s.out.Text() == "BARE READY" {
			return s
		}
	}
	b.Fatal("bare switcher did not start")
	return nil
}

// switchTo has the child switch to profile: the total and each part's time
// (named as gpuhost's steps).
func (s *bareSwitcher) switchTo(b testing.TB, profile string) (time.Duration, map[string]time.Duration) {
	fmt.Fprintln(s.in, profile)
	for s.out.Scan() {
		if v, ok := strings.CutPrefix(s.out.Text(), "BARE "); ok {
			var total time.Duration
			split := map[string]time.Duration{}
			for i, f := range strings.Fields(v) {
				name, val, _ := strings.Cut(f, "=")
				us, err := strconv.ParseInt(val, 10, 64)
				if err != nil {
					b.Fatalf("bare switch to %s: %s", profile, v)
				}
				if i == 0 {
					total = time.Duration(us) * time.Microsecond
					continue
				}
				split[name] = time.Duration(us) * time.Microsecond
			}
			return total, split
		}
	}
	b.Fatalf("bare switcher ended: %v", s.out.Err())
	return 0, nil
}

func (s *bareSwitcher) close() {
	s.in.Close()
	_ = s.cmd.Wait()
}

// TestBareSwitchChild is the bare switcher's body (see startBare).
func TestBareSwitchChild(t *testing.T) {
	spec := strings.Fields(os.Getenv("GPUHOST_BARE"))
	if len(spec) != 6 {
		t.Skip("helper process for BenchmarkSwitchOverhead")
	}
	vllmUnit, vllmPort, ollamaUnit, ollamaPort, model, served := spec[0], spec[1], spec[2], spec[3], spec[4], spec[5]
	ctx := context.Background()
	m, err := systemd.ConnectPrivate(ctx, "/run/systemd/private")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d := &loopback.Dialer{Sockets: map[int]string{}}
	for _, kv := range strings.Split(os.Getenv("GPUHOST_BARE_SOCKETS"), ",") {
		if port, path, ok := strings.Cut(kv, "="); ok {
			n, _ := strconv.Atoi(port)
			d.Sockets[n] = path
		}
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil, DialContext: d.DialContext}}
	poll := func(url string) {
		for {
			if resp, err := client.Get(url); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}
	fmt.Println("BARE READY")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		from, to, port, health := ollamaUnit, vllmUnit, vllmPort, "/health"
		if in.Text() == "llama" {
			from, to, port, health = vllmUnit, ollamaUnit, ollamaPort, "/api/version"
		}
		t0 := time.Now()
		mark := t0
		var split []string
		lap := func(step string) {
			now := time.Now()
			split = append(split, fmt.Sprintf("%s=%d", step, now.Sub(mark).Microseconds()))
			mark = now
		}
		if err := m.Stop(ctx, from); err != nil {
			t.Fatal(err)
		}
		lap(api.StepStop)
		if err := m.Start(ctx, to); err != nil {
			t.Fatal(err)
		}
		lap(api.StepStart)
		poll("http://127.0.0.1:" + port + health)
		lap(api.StepReady)
		if to == ollamaUnit {
			resp, err := client.Post("http://127.0.0.1:"+ollamaPort+"/api/generate", "application/json",
				bytes.NewReader([]byte(`{"model":"`+model+`","keep_alive":-1,"stream":false}`)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			lap(api.StepLoadModel)
		}
		total := time.Since(t0)
		// The same known prompt gpuhost's check asks after a cold start,
		// outside the total: the engine's own time to answer it.
		name := served
		if to == ollamaUnit {
			name = model
		}
		if _, _, _, err := knownPrompt(ctx, client, "http://127.0.0.1:"+port, name, wakeCheckTokens); err != nil {
			t.Fatal(err)
		}
		lap(api.StepWakeCheck)
		fmt.Printf("BARE total=%d %s\n", total.Microseconds(), strings.Join(split, " "))
	}
}

func medianMS(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return float64(m.Microseconds()) / 1000
}
