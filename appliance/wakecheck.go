package appliance

// Verified wake: health and /v1/models answering after a wake_up prove
// little. vLLM's tracker has woken engines that hang while /health stays
// green, answer gibberish, or decode at half speed because draft weights
// were not reloaded. So after every wake (and every cold start) a short
// check runs before the profile counts as active: a known prompt at
// temperature 0 whose few tokens must equal the answer recorded at the
// profile's first cold start, the decode rate of that answer against the
// rate measured when the reference was recorded, and the tool-call round
// trip where the profile has a tool parser and tool calls worked at the
// last cold start. A failed check after a wake restarts the unit cold.
//
// The reference rate is measured over a longer answer (wakeRecheckTokens),
// which costs a few hundred milliseconds at real decode rates; a cold start
// measures it only when nothing it depends on is known to be unchanged:
// the same key (model, served name, argv), the same engine version (vLLM's
// /version, Ollama's /api/version) and GPU driver, and the same answer to
// the known prompt keep the recorded rate. Otherwise, and whenever the
// version cannot be read, it is measured and recorded again.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/internal/atomicfile"
	"gpuhost/internal/sse"
	"gpuhost/units"
)

const (
	// wakeCheckTokens is the known prompt's answer length: two decode
	// intervals for the rate, few enough to cost a fraction of a wake.
	wakeCheckTokens = 3
	// wakeRecheckTokens is the answer length when the short answer looked
	// slow: a busy host delays a token or two (the engine paces by
	// deadline, so delays do not add up), while a half-speed decode is late
	// by every one of these intervals — 31 of them, 60 ms even at 500
	// tokens/s — so only a real slowdown is measured twice.
	wakeRecheckTokens = 32
	// wakeRateTolerance: a woken backend must decode at least this share
	// of the rate measured at its last cold start. The fault it is for
	// halves the rate (0.5); a busy host delays a token now and then, and
	// a rate below the tolerance is measured twice before it counts.
	wakeRateTolerance = 0.6
	// wakeRateSlack: a rate below the tolerance counts only when the
	// answer also took this much longer than the cold rate makes it take.
	// At fast simulated rates (500 tokens/s: 6 ms for the answer) a busy
	// host's scheduling delay alone would halve the rate; at a real or the
	// demo's rate (100–150 tokens/s: 20–30 ms) a half-speed decode is
	// 20–30 ms late and caught.
	wakeRateSlack = 10 * time.Millisecond
	// wakeCheckPrompt is the known prompt.
	wakeCheckPrompt = "Count to ten."
	// wakeCheckTool is the tool of the round trip; its name is in the
	// prompt, which is how a model is asked to call it.
	wakeCheckTool = "gpuhost_wake_check"
)

// wakeCheckTimeout bounds the whole check: a woken engine that hangs
// generation (health green) is found when it runs out.
var wakeCheckTimeout = 5 * time.Second

// Reasons of a failed check: the label of gpuhost_wake_failures_total.
const (
	wakeReasonHang   = "hang"   // no answer within wakeCheckTimeout, or an error status
	wakeReasonOutput = "output" // the known prompt's answer differs
	wakeReasonRate   = "rate"   // decoding below wakeRateTolerance of the cold rate
	wakeReasonTools  = "tools"  // the tool-call round trip broke
	wakeReasonReady  = "ready"  // health or /v1/models failed after the wake
	// wakeReasonResidual: at the sleep before, the backend settled above
	// its measured residual; it is stopped, and its next start is cold.
	wakeReasonResidual = "residual"
)

// wakeRef is what a cold start of a profile recorded: the reference a
// woken backend is held to. Key names what the answer depends on (model,
// served name, argv); a new key records afresh.
type wakeRef struct {
	Key        string    `json:"key"`
	Answer     string    `json:"answer"`
	DecodeTPS  float64   `json:"decode_tps"`
	ToolsOK    bool      `json:"tools_ok"`
	RecordedAt time.Time `json:"recorded_at"`
	// Version is the engine's version and the GPU driver's when the rate
	// was measured ("" in files from before it was kept: measured again).
	Version string `json:"version,omitempty"`
	// CPUOnly: NVML read no GPU memory held by the engine's unit when the
	// rate was measured, so it decoded on the host's CPUs (see
	// rateComparable).
	CPUOnly bool `json:"cpu_only,omitempty"`
}

// wakeBook holds the verified wake's references (wake_check.json in the
// state dir, read once) and the failed checks counted, for the doctor and
// the status. Its lock is its own: a check reads and records references
// while the switch engine's state lock is free.
type wakeBook struct {
	path string
	log  *slog.Logger

	mu       sync.Mutex
	refs     map[string]wakeRef
	loaded   bool
	failures map[string]uint64 // by reason
	last     time.Time
	lastMsg  string
}

func newWakeBook(stateDir string, log *slog.Logger) *wakeBook {
	return &wakeBook{path: filepath.Join(stateDir, "wake_check.json"), log: log}
}

// loadLocked reads the file once; w.mu is held.
func (w *wakeBook) loadLocked() {
	if w.loaded {
		return
	}
	w.loaded, w.refs = true, map[string]wakeRef{}
	if data, err := os.ReadFile(w.path); err == nil {
		if err := json.Unmarshal(data, &w.refs); err != nil {
			w.log.Warn("ignoring unreadable wake check file", "file", w.path, "err", err)
			w.refs = map[string]wakeRef{}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		w.log.Warn("ignoring unreadable wake check file", "file", w.path, "err", err)
	}
}

// ref returns p's reference (ok false when none).
func (w *wakeBook) ref(p string) (wakeRef, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.loadLocked()
	r, ok := w.refs[p]
	return r, ok
}

// setRef records p's reference and writes the file.
func (w *wakeBook) setRef(p string, r wakeRef) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.loadLocked()
	w.refs[p] = r
	data, _ := json.MarshalIndent(w.refs, "", "  ")
	if err := atomicfile.Write(w.path, append(data, '\n'), 0o644); err != nil {
		w.log.Error("persist wake check reference", "err", err)
	}
}

// failed counts a failed check of profile p.
func (w *wakeBook) failed(p, reason, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failures == nil {
		w.failures = map[string]uint64{}
	}
	w.failures[reason]++
	w.last, w.lastMsg = time.Now(), p+": "+msg
}

// failuresSeen reports the failed checks by reason and the last one.
func (w *wakeBook) failuresSeen() (byReason map[string]uint64, last time.Time, lastMsg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]uint64, len(w.failures))
	for k, v := range w.failures {
		out[k] = v
	}
	return out, w.last, w.lastMsg
}

// WakeFailures reports the failed wake checks by reason and the last one,
// for the doctor and the status.
func (s *Supervisor) WakeFailures() (byReason map[string]uint64, last time.Time, lastMsg string) {
	return s.wake.failuresSeen()
}

// wakeKey is what the known prompt's answer depends on.
func (s *Supervisor) wakeKey(p *units.Profile) string {
	bc := s.cfg.BackendFor(p.Backend)
	return p.Model + "|" + p.ServedModelName() + "|" + strings.Join(units.BackendArgs(*p, bc.Simulated), " ")
}

// wantsToolCheck: the profile has a tool parser (vLLM with auto tool
// choice); Ollama's tool calling depends on the model's template, which
// the doctor checks.
func wantsToolCheck(p *units.Profile) bool {
	return p.Backend == units.VLLM && p.VLLM.EnableAutoToolChoice && p.VLLM.ToolCallParser != ""
}

// wakeObs is what one check saw.
type wakeObs struct {
	cpuOnly bool // the engine held no GPU memory (cold starts only)
	answer  string
	tps     float64       // 0 when fewer than two tokens came
	decode  time.Duration // first token to last
	n       int           // tokens
	toolsOK bool
	tools   string // what the round trip saw
}

// observe runs the known prompt and, when asked, the tool-call round trip
// side by side (the check costs the longer of the two, not the sum).
func (s *Supervisor) observe(ctx context.Context, p *units.Profile, tools bool, tokens int) (wakeObs, error) {
	base := "http://127.0.0.1:" + fmt.Sprint(p.Port)
	var obs wakeObs
	var wg sync.WaitGroup
	if tools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			obs.toolsOK, obs.tools = toolRoundTrip(ctx, s.client, base, p.ServedModelName())
		}()
	}
	var err error
	obs.answer, obs.n, obs.decode, err = knownPrompt(ctx, s.client, base, p.ServedModelName(), tokens)
	obs.tps = decodeRate(obs.n, obs.decode)
	wg.Wait()
	return obs, err
}

// checkServes is the check itself. cold: the backend was just started, so
// its answers become (or renew) the reference; else it was woken (or is
// verified while serving) and is held to the reference. withTools: the
// tool-call round trip runs too, where the profile has a tool parser and
// tool calls worked at the cold start (always after a cold start). reason
// is "" when the check passed.
func (s *Supervisor) checkServes(ctx context.Context, p *units.Profile, cold, withTools bool) (msg, reason string, detail map[string]any) {
	return s.checkServesFrom(ctx, p, cold, withTools, nil)
}

// checkServesFrom is checkServes whose cold check takes its first look
// from pre, started beside verify (nil: started here).
func (s *Supervisor) checkServesFrom(ctx context.Context, p *units.Profile, cold, withTools bool, pre *coldProbe) (msg, reason string, detail map[string]any) {
	ctx, cancel := context.WithTimeout(ctx, wakeCheckTimeout)
	defer cancel()
	t0 := time.Now()
	ref, known := s.wake.ref(p.Name)
	known = known && ref.Key == s.wakeKey(p)
	tools := wantsToolCheck(p) && (cold || (withTools && ref.ToolsOK))
	ver, keep := "", false
	var obs wakeObs
	var err error
	if cold {
		// Same model, argv, engine and driver as the reference: its rate
		// and tool verdict stand if the answer does (keepCold). The
		// tool round trip, needed only when the reference is not kept,
		// runs beside the longer answer below.
		if pre == nil {
			pre = s.startColdProbe(ctx, p)
			defer pre.stop()
		}
		t0 = pre.t0
		obs, ver, err = pre.wait(ctx)
		keep = known && ver != "" && ref.Version == ver && ref.DecodeTPS > 0
		tools = false
	} else {
		obs, err = s.observe(ctx, p, tools, wakeCheckTokens)
	}
	detail = map[string]any{"answer": obs.answer, "decode_tps": round1(obs.tps)}
	defer func() { detail["check_ms"] = float64(time.Since(t0).Microseconds()) / 1000 }()
	if err != nil {
		return "known prompt: " + err.Error(), wakeReasonHang, detail
	}
	if cold {
		detail["version"] = ver
		if keep && obs.answer == ref.Answer {
			return s.keepCold(p, ref, detail), "", detail
		}
		// The reference rate is measured over the long answer, as the
		// recheck that decides is: two intervals are too few to be a
		// reference on a busy host (one late token doubles or halves them).
		// The tool round trip runs beside it when it did not run yet.
		long, err := s.observe(ctx, p, wantsToolCheck(p) && !tools, wakeRecheckTokens)
		if err != nil {
			return "known prompt (rate over a longer answer): " + err.Error(), wakeReasonHang, detail
		}
		if wantsToolCheck(p) && !tools {
			obs.toolsOK, obs.tools = long.toolsOK, long.tools
		}
		obs.tps = long.tps
		detail["decode_tps"] = round1(obs.tps)
		held, read := s.engineGPUMiB(ctx, p)
		obs.cpuOnly = read && held == 0
		return s.recordCold(p, ref, known, obs, ver, detail), "", detail
	}
	if !known {
		return "no reference recorded yet (no cold start of this profile seen): answered " + fmt.Sprintf("%q", obs.answer), "", detail
	}
	detail["want_answer"], detail["want_decode_tps"] = ref.Answer, round1(ref.DecodeTPS)
	if obs.answer != ref.Answer {
		return fmt.Sprintf("the known prompt answered %q, recorded at the cold start %q", obs.answer, ref.Answer), wakeReasonOutput, detail
	}
	if tools && !obs.toolsOK {
		return "tool-call round trip: " + obs.tools, wakeReasonTools, detail
	}
	if slow(ref, obs) && !s.rateComparable(ctx, p, ref) {
		detail["rate_compared"] = false
		return fmt.Sprintf("answer as recorded; %.1f tokens/s not compared with the cold start's %.1f: the engine holds no GPU memory, so its decode rate is the host's CPU load", obs.tps, ref.DecodeTPS), "", detail
	}
	if slow(ref, obs) {
		// Once more, longer, before it counts: a busy host delays a token
		// now and then, which two intervals cannot tell from a slowdown.
		again, err := s.observe(ctx, p, false, wakeRecheckTokens)
		if err != nil {
			return "known prompt (rate re-measured): " + err.Error(), wakeReasonHang, detail
		}
		detail["decode_tps_again"] = round1(again.tps)
		if slow(ref, again) {
			return fmt.Sprintf("decodes at %.1f then %.1f tokens/s, below %.0f %% of the %.1f measured at the cold start",
				obs.tps, again.tps, wakeRateTolerance*100, ref.DecodeTPS), wakeReasonRate, detail
		}
	}
	return fmt.Sprintf("answer as recorded, %.1f tokens/s (cold %.1f)%s", obs.tps, ref.DecodeTPS, toolNote(tools, obs)), "", detail
}

// coldProbe is a cold check's first look: the known prompt's short answer
// and the engine's version, read side by side. The switch starts it
// beside verify, whose reads it does not depend on (a verify that fails
// fails the switch whatever the probe saw), so the check's own time
// overlaps verify's; the check waits for it at most wakeCheckTimeout.
type coldProbe struct {
	t0     time.Time
	cancel context.CancelFunc
	done   chan struct{}
	obs    wakeObs
	ver    string
	err    error
}

func (s *Supervisor) startColdProbe(ctx context.Context, p *units.Profile) *coldProbe {
	ctx, cancel := context.WithCancel(ctx)
	c := &coldProbe{t0: time.Now(), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		verc := make(chan string, 1)
		go func() { verc <- s.engineVersion(ctx, p) }()
		c.obs, c.err = s.observe(ctx, p, false, wakeCheckTokens)
		c.ver = <-verc
	}()
	return c
}

// wait returns what the probe saw, or an error when ctx ends first.
func (c *coldProbe) wait(ctx context.Context) (wakeObs, string, error) {
	select {
	case <-c.done:
		return c.obs, c.ver, c.err
	case <-ctx.Done():
		c.stop()
		return c.obs, c.ver, fmt.Errorf("no answer to the known prompt: %w", ctx.Err())
	}
}

// stop ends the probe and waits for it.
func (c *coldProbe) stop() {
	c.cancel()
	<-c.done
}

// recordCold makes a cold start's answers the reference: the answer only
// when none is recorded for this key (a later cold start that answers
// otherwise renews it and says so), the rate and the tool verdict always.
func (s *Supervisor) recordCold(p *units.Profile, ref wakeRef, known bool, obs wakeObs, version string, detail map[string]any) string {
	msg := fmt.Sprintf("recorded: answer %q, %.1f tokens/s%s", obs.answer, obs.tps, toolNote(wantsToolCheck(p), obs))
	if known && ref.Answer != obs.answer {
		msg += fmt.Sprintf(" (the cold start before answered %q; renewed)", ref.Answer)
		detail["previous_answer"] = ref.Answer
	}
	next := wakeRef{Key: s.wakeKey(p), Answer: obs.answer, DecodeTPS: obs.tps, ToolsOK: obs.toolsOK, RecordedAt: time.Now().UTC(), Version: version, CPUOnly: obs.cpuOnly}
	if obs.cpuOnly {
		msg += " (on the CPU: the engine holds no GPU memory)"
	}
	if known && ref.Answer == obs.answer {
		next.RecordedAt = ref.RecordedAt
	}
	if obs.tps == 0 && known {
		next.DecodeTPS = ref.DecodeTPS
	}
	s.wake.setRef(p.Name, next)
	return msg
}

// keepCold is a cold start that answered as recorded with the model, argv,
// engine and driver the reference was measured with: its rate and tool
// verdict stand (the same parser and chat template answer the same tool
// call at temperature 0; the doctor's endpoint.tool_calls probes each
// backend process anyway).
func (s *Supervisor) keepCold(p *units.Profile, ref wakeRef, detail map[string]any) string {
	detail["decode_tps"] = round1(ref.DecodeTPS)
	detail["reference_kept"] = true
	tools := ""
	if wantsToolCheck(p) {
		tools = fmt.Sprintf("; tool calls as recorded (worked: %v)", ref.ToolsOK)
	}
	return fmt.Sprintf("answer as recorded; reference rate %.1f tokens/s kept (measured %s on %s)%s",
		ref.DecodeTPS, ref.RecordedAt.Format(time.RFC3339), ref.Version, tools)
}

// engineVersion is what the reference rate depends on beyond the key: the
// engine's version (vLLM GET /version, Ollama GET /api/version) and the GPU
// driver's. "" when either cannot be read.
func (s *Supervisor) engineVersion(ctx context.Context, p *units.Profile) string {
	path := "/version"
	if p.Backend == units.Ollama {
		path = "/api/version"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+fmt.Sprint(p.Port)+path, nil)
	if err != nil {
		return ""
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var v struct {
		Version string `json:"version"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&v) != nil || v.Version == "" {
		return ""
	}
	snap, err := s.snapshot(ctx)
	if err != nil || snap.DriverVersion == "" {
		return ""
	}
	return fmt.Sprintf("%s %s, driver %s", p.Backend, v.Version, snap.DriverVersion)
}

// rateComparable: a slow answer counts against the reference unless the
// engine ran on the host's CPUs both when the reference was measured and
// now (NVML reads no GPU memory held by its unit). A CPU-bound decode
// shares the cores with everything else on the host, so its rate is the
// host's load, not the engine's health, and restarting it cold mends
// nothing. An engine that held GPU memory at its cold start and holds none
// now (a model that fell back to the CPU) is still compared; an NVML
// reading that fails compares too.
func (s *Supervisor) rateComparable(ctx context.Context, p *units.Profile, ref wakeRef) bool {
	if !ref.CPUOnly {
		return true
	}
	held, read := s.engineGPUMiB(ctx, p)
	return !read || held > 0
}

// engineGPUMiB is the GPU memory the processes of p's backend unit hold;
// read is false when the unit or NVML could not be read.
func (s *Supervisor) engineGPUMiB(ctx context.Context, p *units.Profile) (mib uint64, read bool) {
	st := s.heal.unitNow(ctx, s.cfg.BackendFor(p.Backend).Unit)
	if st.Result == "unreadable" {
		return 0, false
	}
	snap, err := s.snapshot(ctx)
	if err != nil {
		return 0, false
	}
	return unitUsedOn(snap.Devices, st), true
}

// slow: the answer decoded below the tolerance of the cold rate, and late
// by more than the slack.
func slow(ref wakeRef, obs wakeObs) bool {
	if ref.DecodeTPS <= 0 || obs.n < 2 {
		return false
	}
	want := time.Duration(float64(obs.n-1) / ref.DecodeTPS * float64(time.Second))
	return obs.tps < wakeRateTolerance*ref.DecodeTPS && obs.decode-want > wakeRateSlack
}

func toolNote(asked bool, obs wakeObs) string {
	if !asked {
		return ""
	}
	return "; tool call: " + obs.tools
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

// wakeFailed counts and publishes a failed check.
func (s *Supervisor) wakeFailed(r *switchRun, p *units.Profile, reason, msg string, cold bool) {
	s.wake.failed(p.Name, reason, msg)
	text := fmt.Sprintf("%s woke wrong (%s): %s; restarting it cold", p.Name, reason, msg)
	switch {
	case cold:
		text = fmt.Sprintf("%s failed its check after a cold start (%s): %s", p.Name, reason, msg)
	case r.recheck:
		text = fmt.Sprintf("%s answers wrong while it says it is awake (%s): %s; restarting it cold", p.Name, reason, msg)
	}
	r.event(api.Event{Kind: api.EventWakeCheck, Status: api.StatusFailed, Profile: p.Name, Message: text,
		Detail: map[string]any{api.DetailReason: reason, "cold": cold}})
}

// maxMeasurableTPS: above this one stream's decode rate is not a
// measurement. No engine decodes one sequence that fast; a busy host that
// reads the whole answer in one burst makes the span between the first and
// the last token microseconds long (521,166 tokens/s was seen), and such a
// reference would fail every later check on its rate.
const maxMeasurableTPS = 5000

// decodeRate is n tokens' rate over the span from the first to the last;
// 0 (not measured) for fewer than two tokens or a span too short to time
// the engine.
func decodeRate(n int, span time.Duration) float64 {
	if n < 2 || span <= 0 {
		return 0
	}
	tps := float64(n-1) / span.Seconds()
	if tps > maxMeasurableTPS {
		return 0
	}
	return tps
}

// knownPrompt streams the known prompt and returns the answer and its
// decode rate: tokens after the first over the time from the first to the
// last (prefill and connection set-up excluded).
func knownPrompt(ctx context.Context, client *http.Client, base, model string, tokens int) (answer string, n int, decode time.Duration, err error) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "temperature": 0, "seed": 0, "max_tokens": tokens,
		"messages": []any{map[string]any{"role": "user", "content": wakeCheckPrompt}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return "", 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, excerpt(errorMessage(msg), 200))
	}
	var text strings.Builder
	var first, last time.Time
	rd := sse.NewReader(io.LimitReader(resp.Body, doctorProbeMaxBody), doctorProbeMaxBody)
	for {
		ev, rerr := rd.Next()
		if errors.Is(rerr, io.EOF) || string(bytes.TrimSpace(ev.Data)) == "[DONE]" {
			break
		}
		if rerr != nil && !errors.Is(rerr, sse.ErrIncomplete) {
			return text.String(), n, 0, fmt.Errorf("read the answer: %w", rerr)
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(ev.Data, &chunk) != nil || len(chunk.Choices) == 0 || chunk.Choices[0].Delta.Content == "" {
			continue
		}
		now := time.Now()
		if n == 0 {
			first = now
		}
		last = now
		n++
		text.WriteString(chunk.Choices[0].Delta.Content)
	}
	if n == 0 {
		return "", 0, 0, errors.New("the answer has no tokens")
	}
	return text.String(), n, last.Sub(first), nil
}

// toolRoundTrip offers one tool without parameters and asks for it: the
// smallest request that shows whether tool calls come back structured.
func toolRoundTrip(ctx context.Context, client *http.Client, base, model string) (bool, string) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "temperature": 0, "max_tokens": 64, "tool_choice": "auto",
		"messages": []any{map[string]any{"role": "user", "content": "Call " + wakeCheckTool + "."}},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{
			"name": wakeCheckTool, "parameters": map[string]any{"type": "object", "properties": map[string]any{}}}}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false, "request failed: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return false, fmt.Sprintf("status %d: %s", resp.StatusCode, excerpt(errorMessage(msg), 200))
	}
	r, err := readWholeReply(resp.Body)
	if err != nil {
		return false, err.Error()
	}
	if len(r.names) == 0 || r.names[0] != wakeCheckTool {
		return false, fmt.Sprintf("no structured call of %s: content %q, calls %v", wakeCheckTool, excerpt(r.content, 120), r.names)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(r.args[0]), &obj); err != nil {
		return false, fmt.Sprintf("arguments are not a JSON object: %q", excerpt(r.args[0], 120))
	}
	return true, "structured"
}

// checkStep is the wake_check step: the check, failing with its reason.
func (l *leg) checkStep(cold bool, reason *string) stepFunc {
	return func(ctx context.Context) (string, map[string]any, error) {
		// After a level-1 wake the weights are the same bytes copied back
		// from host memory: the known answer and the rate are the check,
		// and the tool round trip (a longer prompt, most of the check's
		// time) is left to the cold starts and the periodic verify.
		msg, rsn, detail := l.r.s.checkServesFrom(ctx, l.p, cold, cold || l.wokeLevel != 1, l.pre)
		if rsn != "" {
			*reason = rsn
			l.r.s.wakeFailed(l.r, l.p, rsn, msg, cold)
			return "", detail, fmt.Errorf("%s (%s)", msg, rsn)
		}
		return msg, detail, nil
	}
}

// coldCheck is the last step after a cold start: a backend that does not
// answer the known prompt fails the switch like one that does not start.
func (l *leg) coldCheck(ctx context.Context) (string, map[string]any, error) {
	var reason string
	return l.checkStep(true, &reason)(ctx)
}

// verifyThenCheck runs verify and, after a cold start, the check, whose
// first look (coldProbe) runs beside verify.
func (l *leg) verifyThenCheck(ctx context.Context) error {
	if l.running {
		return l.upStep(ctx, api.StepVerify, l.verify)
	}
	l.pre = l.r.s.startColdProbe(ctx, l.p)
	defer func() { l.pre.stop(); l.pre = nil }()
	if err := l.upStep(ctx, api.StepVerify, l.verify); err != nil {
		return err
	}
	return l.upStep(ctx, api.StepWakeCheck, l.coldCheck)
}

// afterWake runs ready, verify and the check after a wake. false: the wake
// did not hold; the unit has been stopped and left out of standby, and the
// sequence goes on with a cold start.
func (l *leg) afterWake(ctx context.Context) bool {
	r := l.r
	var reason string
	err := r.step(ctx, api.StepReady, l.waitReady)
	if err == nil {
		err = r.step(ctx, api.StepVerify, l.verify)
	}
	if err == nil {
		err = r.step(ctx, api.StepWakeCheck, l.checkStep(false, &reason))
	}
	if err == nil {
		return true
	}
	if reason == "" {
		r.s.wakeFailed(r, l.p, wakeReasonReady, err.Error(), false)
	}
	r.cleanup(l.unit)
	r.s.standby.clear(l.unit)
	l.running, l.wake = false, false
	return false
}
