package simulator

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/testkit"
	"gpuhost/nvml"
)

// Sizes of the sleep mode tests' engine: 1000 MiB claimed when awake, of
// which 100 stay while asleep, 600 are weights and 300 the KV cache. The
// copies run at 1000 GB/s, so no test waits for them.
const (
	tVRAM     = 1000
	tResidual = 100
	tWeights  = 600
)

func sleepyVLLM(t *testing.T, mod func(*Options)) (*sim, string) {
	t.Helper()
	dir := t.TempDir()
	s, _ := fastVLLM(t, func(o *Options) {
		o.SimDir, o.DevMode, o.EnableSleepMode = dir, true, true
		o.VRAMMiB, o.SleepResidualMiB, o.WeightsMiB = tVRAM, tResidual, tWeights
		o.H2DGBps, o.ReloadGBps = 1000, 1000
		if mod != nil {
			mod(o)
		}
	})
	return s, dir
}

// ownClaim is this process's claim in dir, read as the simulated GPU does.
func ownClaim(t *testing.T, dir string) nvml.Claim {
	t.Helper()
	claims, err := nvml.ReadClaims(dir)
	if err != nil || len(claims) != 1 || claims[0].PID != os.Getpid() {
		t.Fatalf("claims = %+v, %v; want exactly this process's", claims, err)
	}
	return claims[0]
}

// wantClaim checks the claim and what an nvml.Sim over dir makes of it: the
// process at mib, the GPU's used memory, and the host memory left.
func wantClaim(t *testing.T, dir string, mib, hostMiB uint64) {
	t.Helper()
	if c := ownClaim(t, dir); c.MiB != mib || c.HostMiB != hostMiB || c.Name != "vllm Qwen/Qwen3-Coder-30B-A3B-Instruct" {
		t.Fatalf("claim = %+v; want %d MiB VRAM and %d MiB host", c, mib, hostMiB)
	}
	gpu := nvml.NewSim(nvml.SimConfig{Dir: dir})
	snap, err := gpu.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d, _ := snap.Device0()
	if len(d.Processes) != 1 || d.Processes[0].UsedMiB != mib || d.MemoryUsedMiB != nvml.DefaultSimBaselineMiB+mib {
		t.Fatalf("simulated GPU: used %d MiB, processes %+v; want the process at %d MiB", d.MemoryUsedMiB, d.Processes, mib)
	}
	if avail, err := gpu.HostMemAvailableMiB(context.Background()); err != nil || avail != nvml.DefaultSimHostMemMiB-hostMiB {
		t.Fatalf("host memory available %d MiB (%v); want %d", avail, err, nvml.DefaultSimHostMemMiB-hostMiB)
	}
}

func post(t *testing.T, s *sim, path string) {
	t.Helper()
	code, body, _ := s.do(t, http.MethodPost, path, nil)
	if code != http.StatusOK || len(body) != 0 {
		t.Fatalf("POST %s = %d %q; want 200 with an empty body", path, code, body)
	}
}

func isSleeping(t *testing.T, s *sim) bool {
	t.Helper()
	code, body, _ := s.do(t, http.MethodGet, "/is_sleeping", nil)
	v := decode[map[string]bool](t, body)
	if code != http.StatusOK || len(v) != 1 {
		t.Fatalf("/is_sleeping = %d %s", code, body)
	}
	return v["is_sleeping"]
}

// generation is what chat and completions answer now: the status and, for
// an error, its type and message.
func generation(t *testing.T, s *sim) (status int, errType, msg string) {
	t.Helper()
	code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{"max_tokens": 3}))
	ccode, cbody, _ := s.do(t, http.MethodPost, "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 3})
	if code != ccode {
		t.Fatalf("chat answered %d, completions %d (%s)", code, ccode, cbody)
	}
	if code == http.StatusOK {
		return code, "", ""
	}
	e := decode[openAIError](t, body)
	if e.Error.Code != float64(code) {
		t.Fatalf("error code %v in a %d answer", e.Error.Code, code)
	}
	return code, e.Error.Type, e.Error.Message
}

func sleepState(t *testing.T, s *sim) [3]float64 {
	t.Helper()
	m := scrape(t, s)
	return [3]float64{
		metric(t, m, "vllm:engine_sleep_state", `sleep_state="awake"`),
		metric(t, m, "vllm:engine_sleep_state", `sleep_state="weights_offloaded"`),
		metric(t, m, "vllm:engine_sleep_state", `sleep_state="discard_all"`),
	}
}

var (
	stateAwake     = [3]float64{1, 0, 0}
	stateOffloaded = [3]float64{0, 1, 0}
	stateDiscarded = [3]float64{0, 0, 1}
)

// Without VLLM_SERVER_DEV_MODE the routes do not exist; with it but
// without --enable-sleep-mode /sleep fails and nothing is released.
func TestVLLMSleepRoutesNeedDevModeAndSleepMode(t *testing.T) {
	routes := []struct{ method, path string }{
		{http.MethodPost, "/sleep"}, {http.MethodPost, "/sleep?level=2"}, {http.MethodPost, "/wake_up"},
		{http.MethodPost, "/wake_up?tags=weights"}, {http.MethodGet, "/is_sleeping"},
		{http.MethodPost, "/collective_rpc"}, {http.MethodPost, "/reset_prefix_cache"},
	}
	t.Run("no dev mode", func(t *testing.T) {
		s, dir := sleepyVLLM(t, func(o *Options) { o.DevMode = false })
		for _, r := range routes {
			code, body, _ := s.do(t, r.method, r.path, `{"method":"reload_weights"}`)
			if code != http.StatusNotFound || strings.TrimSpace(string(body)) != `{"detail":"Not Found"}` {
				t.Errorf("%s %s = %d %s; want FastAPI's 404", r.method, r.path, code, body)
			}
		}
		wantClaim(t, dir, tVRAM, 0)
		if st := sleepState(t, s); st != stateAwake {
			t.Errorf("sleep state %v", st)
		}
	})
	t.Run("dev mode without --enable-sleep-mode", func(t *testing.T) {
		s, dir := sleepyVLLM(t, func(o *Options) { o.EnableSleepMode = false })
		for _, path := range []string{"/sleep", "/sleep?level=1", "/sleep?level=2"} {
			code, body, _ := s.do(t, http.MethodPost, path, nil)
			e := decode[openAIError](t, body)
			if code != http.StatusInternalServerError || e.Error.Type != "InternalServerError" || !strings.Contains(e.Error.Message, "Sleep mode is not enabled") {
				t.Errorf("POST %s = %d %s; want 500 saying sleep mode is not enabled", path, code, body)
			}
		}
		if isSleeping(t, s) {
			t.Error("is_sleeping after a refused sleep")
		}
		post(t, s, "/wake_up") // not sleeping: a no-op
		post(t, s, "/reset_prefix_cache")
		wantClaim(t, dir, tVRAM, 0)
		if code, _, msg := generation(t, s); code != http.StatusOK {
			t.Errorf("generation = %d %s", code, msg)
		}
	})
}

// Each level releases what vLLM releases, the claim follows, requests are
// refused while asleep, and a plain /wake_up restores the memory; after
// level 2 the weights are garbage until reloaded.
func TestVLLMSleepLevels(t *testing.T) {
	tests := []struct {
		name      string
		path      string
		hostMiB   uint64 // held while asleep
		state     [3]float64
		validWake bool // generation works after a plain /wake_up
	}{
		{"default is level 1", "/sleep", tWeights, stateOffloaded, true},
		{"level 1", "/sleep?level=1", tWeights, stateOffloaded, true},
		{"level 2", "/sleep?level=2", 0, stateDiscarded, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, dir := sleepyVLLM(t, nil)
			if isSleeping(t, s) || sleepState(t, s) != stateAwake {
				t.Fatal("asleep before /sleep")
			}
			wantClaim(t, dir, tVRAM, 0)

			post(t, s, tt.path)
			if !isSleeping(t, s) {
				t.Fatal("is_sleeping false after /sleep")
			}
			wantClaim(t, dir, tResidual, tt.hostMiB)
			if st := sleepState(t, s); st != tt.state {
				t.Errorf("sleep state %v; want %v", st, tt.state)
			}
			if code, typ, msg := generation(t, s); code != http.StatusServiceUnavailable || typ != "ModelSleepingError" || !strings.Contains(msg, "sleep mode") {
				t.Errorf("generation while asleep = %d %s %q; want 503 ModelSleepingError", code, typ, msg)
			}
			// What needs no weights keeps working.
			for _, p := range []string{"/health", "/v1/models", "/version"} {
				if code, body, _ := s.do(t, http.MethodGet, p, nil); code != http.StatusOK {
					t.Errorf("GET %s while asleep = %d %s", p, code, body)
				}
			}
			if code, body, _ := s.do(t, http.MethodPost, "/tokenize", map[string]any{"prompt": "a b"}); code != http.StatusOK {
				t.Errorf("/tokenize while asleep = %d %s", code, body)
			}

			post(t, s, "/wake_up")
			if isSleeping(t, s) || sleepState(t, s) != stateAwake {
				t.Fatal("still asleep after /wake_up")
			}
			wantClaim(t, dir, tVRAM, 0)
			code, typ, msg := generation(t, s)
			if tt.validWake && code != http.StatusOK {
				t.Fatalf("generation after wake = %d %s %q", code, typ, msg)
			}
			if !tt.validWake {
				if code != http.StatusInternalServerError || !strings.Contains(msg, "not reloaded") {
					t.Fatalf("generation with discarded weights = %d %s %q; want 500 saying they were not reloaded", code, typ, msg)
				}
				if code, body, _ := s.do(t, http.MethodPost, "/collective_rpc", map[string]any{"method": "reload_weights"}); code != http.StatusOK ||
					strings.TrimSpace(string(body)) != `{"results":[null]}` {
					t.Fatalf("reload_weights = %d %s", code, body)
				}
				if code, _, msg := generation(t, s); code != http.StatusOK {
					t.Fatalf("generation after reload = %d %q", code, msg)
				}
			}
		})
	}
}

// The documented partial wake-ups, step by step: is_sleeping stays true
// until every tag is awake, the claim rises part by part, and the metric
// says awake after any wake_up, as vLLM's AsyncLLM records it.
func TestVLLMSleepPartialWake(t *testing.T) {
	type step struct {
		path         string
		body         any
		sleeping     bool
		mib, hostMiB uint64
		state        [3]float64
		genStatus    int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"level 2, documented sequence", []step{
			{path: "/sleep?level=2", sleeping: true, mib: tResidual, state: stateDiscarded, genStatus: 503},
			{path: "/wake_up?tags=weights", sleeping: true, mib: tResidual + tWeights, state: stateAwake, genStatus: 503},
			{path: "/collective_rpc", body: map[string]any{"method": "reload_weights"}, sleeping: true, mib: tResidual + tWeights, state: stateAwake, genStatus: 503},
			{path: "/wake_up?tags=kv_cache", mib: tVRAM, state: stateAwake, genStatus: 200},
		}},
		{"level 2, reload forgotten", []step{
			{path: "/sleep?level=2", sleeping: true, mib: tResidual, state: stateDiscarded, genStatus: 503},
			{path: "/wake_up?tags=weights", sleeping: true, mib: tResidual + tWeights, state: stateAwake, genStatus: 503},
			{path: "/wake_up?tags=kv_cache", mib: tVRAM, state: stateAwake, genStatus: 500},
			{path: "/collective_rpc", body: map[string]any{"method": "reload_weights"}, mib: tVRAM, state: stateAwake, genStatus: 200},
		}},
		{"level 2, both tags at once", []step{
			{path: "/sleep?level=2", sleeping: true, mib: tResidual, state: stateDiscarded, genStatus: 503},
			{path: "/wake_up?tags=kv_cache&tags=weights", mib: tVRAM, state: stateAwake, genStatus: 500},
		}},
		{"level 1, KV cache first", []step{
			{path: "/sleep?level=1", sleeping: true, mib: tResidual, hostMiB: tWeights, state: stateOffloaded, genStatus: 503},
			{path: "/wake_up?tags=kv_cache", sleeping: true, mib: tVRAM - tWeights, hostMiB: tWeights, state: stateAwake, genStatus: 503},
			{path: "/wake_up?tags=weights", mib: tVRAM, state: stateAwake, genStatus: 200},
		}},
		{"level 1, weights first", []step{
			{path: "/sleep?level=1", sleeping: true, mib: tResidual, hostMiB: tWeights, state: stateOffloaded, genStatus: 503},
			{path: "/wake_up?tags=weights", sleeping: true, mib: tResidual + tWeights, state: stateAwake, genStatus: 503},
			{path: "/wake_up?tags=kv_cache", mib: tVRAM, state: stateAwake, genStatus: 200},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, dir := sleepyVLLM(t, nil)
			for i, st := range tt.steps {
				code, body, _ := s.do(t, http.MethodPost, st.path, st.body)
				if code != http.StatusOK {
					t.Fatalf("step %d %s = %d %s", i, st.path, code, body)
				}
				if got := isSleeping(t, s); got != st.sleeping {
					t.Fatalf("step %d %s: is_sleeping %v; want %v", i, st.path, got, st.sleeping)
				}
				wantClaim(t, dir, st.mib, st.hostMiB)
				if got := sleepState(t, s); got != st.state {
					t.Errorf("step %d %s: sleep state %v; want %v", i, st.path, got, st.state)
				}
				if code, _, msg := generation(t, s); code != st.genStatus {
					t.Fatalf("step %d %s: generation = %d %q; want %d", i, st.path, code, msg, st.genStatus)
				}
			}
		})
	}
}

// What vLLM only warns about changes nothing: sleeping again, waking an
// awake engine, waking a tag that is not asleep or does not exist.
func TestVLLMSleepNoOps(t *testing.T) {
	tests := []struct {
		name         string
		setup        []string
		noop         string
		sleeping     bool
		mib, hostMiB uint64
		state        [3]float64 // after the no-op
	}{
		{"wake while awake", nil, "/wake_up", false, tVRAM, 0, stateAwake},
		// vLLM's AsyncLLM records the new level even though the executor
		// does nothing: the metric says discard_all while the weights sit
		// in host memory.
		{"sleep while asleep", []string{"/sleep?level=1"}, "/sleep?level=2", true, tResidual, tWeights, stateDiscarded},
		{"wake a tag already awake", []string{"/sleep?level=2", "/wake_up?tags=weights"}, "/wake_up?tags=weights", true, tResidual + tWeights, 0, stateAwake},
		{"wake with an unknown tag", []string{"/sleep?level=1"}, "/wake_up?tags=kv_cache&tags=lora", true, tResidual, tWeights, stateAwake},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, dir := sleepyVLLM(t, nil)
			for _, p := range tt.setup {
				post(t, s, p)
			}
			post(t, s, tt.noop)
			if got := isSleeping(t, s); got != tt.sleeping {
				t.Fatalf("is_sleeping %v; want %v", got, tt.sleeping)
			}
			wantClaim(t, dir, tt.mib, tt.hostMiB)
			if got := sleepState(t, s); got != tt.state {
				t.Errorf("sleep state %v; want %v", got, tt.state)
			}
		})
	}
}

func TestVLLMSleepErrors(t *testing.T) {
	s, dir := sleepyVLLM(t, nil)
	tests := []struct {
		name, path string
		body       any
		status     int
		contains   string
	}{
		{"level 3", "/sleep?level=3", nil, 400, "want 1"},
		{"level not a number", "/sleep?level=deep", nil, 400, "want 1"},
		{"empty level", "/sleep?level=", nil, 400, "want 1"},
		{"rpc body not JSON", "/collective_rpc", `{"method":`, 400, `"detail":"JSON decode error`},
		{"rpc without method", "/collective_rpc", map[string]any{"args": []string{}}, 400, `{"detail":"Missing 'method' in request body"}`},
		{"rpc method not simulated", "/collective_rpc", map[string]any{"method": "update_weights"}, 500, "not simulated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, _ := s.do(t, http.MethodPost, tt.path, tt.body)
			if code != tt.status || !strings.Contains(string(body), tt.contains) {
				t.Errorf("POST %s = %d %s; want %d containing %q", tt.path, code, body, tt.status, tt.contains)
			}
		})
	}
	if isSleeping(t, s) {
		t.Fatal("a refused request put the engine to sleep")
	}
	wantClaim(t, dir, tVRAM, 0)
	t.Run("reload while the weights are asleep", func(t *testing.T) {
		post(t, s, "/sleep?level=2")
		code, body, _ := s.do(t, http.MethodPost, "/collective_rpc", map[string]any{"method": "reload_weights"})
		if code != http.StatusInternalServerError || !strings.Contains(string(body), "wake_up?tags=weights first") {
			t.Fatalf("reload_weights = %d %s", code, body)
		}
		wantClaim(t, dir, tResidual, 0)
	})
}

// holdCopies replaces the copy wait with one the test releases: each copy
// (offload, copy back, reload) reports its duration on started and waits for
// a value on release.
func holdCopies(t *testing.T) (started <-chan time.Duration, release chan<- struct{}) {
	t.Helper()
	st, rel := make(chan time.Duration, 4), make(chan struct{})
	orig := copyWait
	copyWait = func(ctx context.Context, d time.Duration) error {
		st <- d
		select {
		case <-rel:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t.Cleanup(func() { copyWait = orig })
	return st, rel
}

// While level 1 copies the weights out, the host memory is held, the VRAM
// not yet released, is_sleeping still false and no generation starts; on
// wake_up the weights' VRAM is mapped before the copy back, and the host
// memory goes when it is done. The copies last weights / --h2d-gbps.
func TestVLLMSleepCopiesInOrder(t *testing.T) {
	started, release := holdCopies(t)
	s, dir := sleepyVLLM(t, func(o *Options) { o.H2DGBps = 25 })
	want := copyTime(tWeights, 25) // 600 MiB over PCIe 4.0 x16: about 25 ms
	if want < 20*time.Millisecond || want > 30*time.Millisecond {
		t.Fatalf("copyTime(600 MiB, 25 GB/s) = %s", want)
	}
	async := func(path string) chan int {
		done := make(chan int, 1)
		go func() {
			code, _, _ := doCtx(t, context.Background(), http.MethodPost, s.base+path, nil)
			done <- code
		}()
		return done
	}

	done := async("/sleep?level=1")
	if d := <-started; d != want {
		t.Fatalf("offload takes %s; want %s", d, want)
	}
	wantClaim(t, dir, tVRAM, tWeights)
	if isSleeping(t, s) {
		t.Error("is_sleeping true before the offload finished (vLLM sets it after)")
	}
	if code, typ, _ := generation(t, s); code != http.StatusServiceUnavailable || typ != "ModelSleepingError" {
		t.Errorf("generation while falling asleep = %d %s", code, typ)
	}
	release <- struct{}{}
	if code := <-done; code != http.StatusOK {
		t.Fatalf("/sleep = %d", code)
	}
	wantClaim(t, dir, tResidual, tWeights)

	done = async("/wake_up")
	if d := <-started; d != want {
		t.Fatalf("copy back takes %s; want %s", d, want)
	}
	wantClaim(t, dir, tResidual+tWeights, tWeights)
	if !isSleeping(t, s) {
		t.Error("is_sleeping false during the copy back")
	}
	release <- struct{}{}
	if code := <-done; code != http.StatusOK {
		t.Fatalf("/wake_up = %d", code)
	}
	wantClaim(t, dir, tVRAM, 0)

	// Level 2 copies nothing on the way down or up; the reload reads the
	// weights at --reload-gbps.
	post(t, s, "/sleep?level=2")
	post(t, s, "/wake_up?tags=weights")
	rpc := make(chan int, 1)
	go func() {
		code, _, _ := doCtx(t, context.Background(), http.MethodPost, s.base+"/collective_rpc", map[string]any{"method": "reload_weights"})
		rpc <- code
	}()
	if d := <-started; d != copyTime(tWeights, 1000) {
		t.Fatalf("reload takes %s; want %s", d, copyTime(tWeights, 1000))
	}
	release <- struct{}{}
	if code := <-rpc; code != http.StatusOK {
		t.Fatalf("reload_weights = %d", code)
	}
	post(t, s, "/wake_up?tags=kv_cache")
	if code, _, msg := generation(t, s); code != http.StatusOK {
		t.Fatalf("generation after the level 2 sequence = %d %q", code, msg)
	}
	select {
	case d := <-started:
		t.Fatalf("an unexpected copy of %s", d)
	default:
	}
}

// Putting the engine to sleep aborts what it is generating: a stream ends
// with finish_reason "abort" and [DONE], a whole answer comes back with what
// it had, and vLLM's metrics count the aborts.
func TestVLLMSleepAbortsRunningRequests(t *testing.T) {
	s, dir := sleepyVLLM(t, func(o *Options) { o.DecodeTPS = 200 })
	st := openStream(t, s, chatBody(map[string]any{"stream": true, "max_tokens": 20000, "ignore_eos": true}))
	defer st.close()
	for i := 0; i < 3; i++ {
		if _, err := st.r.next(); err != nil {
			t.Fatal(err)
		}
	}
	whole := make(chan []byte, 1)
	go func() {
		_, body, _ := doCtx(t, context.Background(), http.MethodPost, s.base+"/v1/completions",
			map[string]any{"prompt": "hi", "max_tokens": 20000, "ignore_eos": true})
		whole <- body
	}()
	testkit.Eventually(t, 15*time.Second, func() bool { return metric(t, scrape(t, s), "vllm:num_requests_running") == 2 }, "both requests running")

	post(t, s, "/sleep?level=2")
	var last string
	for {
		ev, err := st.r.next()
		if err != nil {
			t.Fatalf("stream ended without [DONE]: %v (last event %s)", err, last)
		}
		if ev == "[DONE]" {
			break
		}
		last = ev
	}
	c := decode[chunk](t, []byte(last))
	if len(c.Choices) != 1 || c.Choices[0].FinishReason == nil || *c.Choices[0].FinishReason != "abort" {
		t.Fatalf("last chunk %s; want finish_reason abort", last)
	}
	type completion struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage oaiUsage `json:"usage"`
	}
	var resp completion
	select {
	case body := <-whole:
		resp = decode[completion](t, body)
	case <-time.After(20 * time.Second):
		t.Fatal("the whole answer did not come back after sleep")
	}
	if len(resp.Choices) != 1 || resp.Choices[0].FinishReason != "abort" || resp.Usage.CompletionTokens >= 20000 {
		t.Fatalf("whole answer %+v; want finish_reason abort, cut short", resp)
	}
	m := scrape(t, s)
	if n := metric(t, m, "vllm:request_success_total", `finished_reason="abort"`); n != 2 {
		t.Errorf("aborted requests %v; want 2", n)
	}
	if n := metric(t, m, "vllm:num_requests_running"); n != 0 {
		t.Errorf("running after sleep: %v", n)
	}
	wantClaim(t, dir, tResidual, 0)
}

// A stopped server leaves no claim, asleep or not.
func TestVLLMSleepingServerReleasesClaimOnExit(t *testing.T) {
	s, dir := sleepyVLLM(t, nil)
	post(t, s, "/sleep?level=1")
	wantClaim(t, dir, tResidual, tWeights)
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after exit: %+v", c)
	}
}
