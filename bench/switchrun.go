package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gpuhost/api"
)

// Defaults and bounds of `gpuhost bench switch`.
const (
	DefaultSwitchRounds = 3
	// DefaultSwitchTimeout bounds one sample: the switch and the first
	// token after it (a vLLM start can take minutes).
	DefaultSwitchTimeout = 10 * time.Minute
	// SwitchRoundsLimit is the most rounds a switch bench takes (exported
	// so that the command names it in its flag error).
	SwitchRoundsLimit = 100
	// switchEventGrace is how long the events of a switch may lag behind
	// its first token (the daemon sets the state before it publishes the
	// end of the switch, and the proxy forwards on the state).
	switchEventGrace = 30 * time.Second
	// switchMaxTokens is the length of the /v1 requests: only the first
	// token is timed, the rest just ends the request.
	switchMaxTokens = 4
)

// PhaseSwitch is the phase of a switch result's progress. Its errors carry
// the phase "preflight" (the daemon's status, the profiles), "prepare"
// (making A active) or the path of the sample that failed (switch,
// request).
const PhaseSwitch = "switch"

// ErrUnknownProfile is returned by RunSwitch when A or B is not a profile
// of the daemon (nothing was measured).
var ErrUnknownProfile = errors.New("no such profile on the daemon")

// SwitchOptions configure RunSwitch.
type SwitchOptions struct {
	// Daemon is the daemon's API; its BaseURL + "/v1" is the proxy the
	// requests go to, with its Token.
	Daemon *api.Client
	// A and B are the daemon's profiles. A is made active first (not
	// measured); each round measures A→B and B→A.
	A, B   string
	Rounds int
	// Timeout bounds one sample; default 10 minutes.
	Timeout        time.Duration
	GpuhostVersion string
	GpuhostCommit  string
	// Progress, when set, is called after each sample.
	Progress func(Progress)
	// HTTPClient sends the /v1 requests (default: a plain client).
	HTTPClient *http.Client
	// Started fixes the start time and thereby the result ID.
	Started time.Time
}

// Check reports the error RunSwitch would refuse the options with, so
// that the command can refuse a bad flag as a usage error.
func (o SwitchOptions) Check() error {
	_, err := o.withDefaults()
	return err
}

func (o SwitchOptions) withDefaults() (SwitchOptions, error) {
	if o.Rounds == 0 {
		o.Rounds = DefaultSwitchRounds
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultSwitchTimeout
	}
	switch {
	case o.A == "" || o.B == "":
		return o, errors.New("two profile names are needed")
	case o.A == o.B:
		return o, fmt.Errorf("profiles %q and %q are the same: a switch needs two profiles", o.A, o.B)
	case o.Rounds < 1 || o.Rounds > SwitchRoundsLimit:
		return o, fmt.Errorf("rounds %d: want 1 to %d", o.Rounds, SwitchRoundsLimit)
	case o.Timeout < 0:
		return o, fmt.Errorf("timeout %s: must be positive", o.Timeout)
	}
	return o, nil
}

// RunSwitch measures switching between the daemon's profiles A and B.
// Every round takes, in this order: A→B and B→A on the switch path
// (POST /api/switch, then at once a streamed /v1 request to the target's
// model, which the proxy holds until the switch is done; timed from the
// switch request to the first token), then A→B and B→A on the request path
// (a streamed /v1 request naming the target's model while the other
// profile is active, so that the proxy's auto_switch switches; timed from
// the request to its first token). The request path is skipped, with a
// note, when the proxy does not switch for a request (proxy.auto_switch is
// off) or cannot reach the target by its model name. Each sample's mode
// (cold or standby) and the switch's own duration come from the switch's
// events (GET /api/events). The daemon is left with A active.
//
// As Run, the result is never nil: a failure stops the rounds and is
// recorded (status partial with samples, failed without); the error is the
// reason, naming the profile and the step.
func RunSwitch(ctx context.Context, opts SwitchOptions) (*Result, error) {
	started := opts.Started
	if started.IsZero() {
		started = time.Now()
	}
	o, cfgErr := opts.withDefaults()
	if cfgErr == nil && o.Daemon == nil {
		cfgErr = errors.New("no daemon to talk to")
	}
	r := &Result{
		SchemaVersion: SchemaVersion, Status: StatusFailed, StartedAt: started.UTC(), ID: NewID(started, "switch-"+o.A+"-"+o.B),
		Config:  RunConfig{Repeats: o.Rounds, Phases: []string{PhaseSwitch}, RequestTimeoutS: o.Timeout.Seconds()},
		Prefill: []Prefill{}, Decode: []Decode{}, Serving: []Serving{}, CrossChecks: []Cross{}, Errors: []RunError{}, Notes: []string{},
		Switch: &SwitchBench{A: o.A, B: o.B, Rounds: o.Rounds, Profiles: []SwitchProfile{}, RequestPath: RequestPathMeasured,
			Samples: []SwitchSample{}, Groups: []SwitchGroup{}},
	}
	r.Fingerprint = Fingerprint{Profile: o.A + "," + o.B, GpuhostVersion: o.GpuhostVersion, GpuhostCommit: o.GpuhostCommit}
	r.Fingerprint.Host, _ = os.Hostname()
	defer func() { r.FinishedAt = time.Now().UTC() }()
	if cfgErr != nil {
		err := fmt.Errorf("bench switch options: %w", cfgErr)
		r.addError("config", err.Error())
		return r, err
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true}}
		defer hc.CloseIdleConnections()
	}
	sr := &switchRunner{o: o, r: r, hc: hc}
	err := sr.run(ctx)
	sb := r.Switch
	sb.Groups = groupSwitchSamples(o.A, o.B, sb.Samples)
	sb.Outliers = switchOutliers(sb.Samples)
	if n := outlierNote(sb.Outliers); n != "" {
		r.Notes = append(r.Notes, n)
	}
	switch {
	case len(sb.Samples) == 0:
		r.Status = StatusFailed
	case err != nil || len(r.Errors) > 0:
		r.Status = StatusPartial
	default:
		r.Status = StatusOK
	}
	if err == nil && len(sb.Samples) == 0 {
		err = errors.New("nothing was measured; see the recorded errors")
	}
	return r, err
}

// switchRunner holds one switch measurement's state.
type switchRunner struct {
	o       SwitchOptions
	r       *Result
	hc      *http.Client
	a, b    SwitchProfile
	lastSeq uint64 // the newest event seen, where the next request path's events start
	done    int
	total   int
}

func (sr *switchRunner) run(ctx context.Context) error {
	o, r, sb := sr.o, sr.r, sr.r.Switch
	fail := func(phase string, err error) error {
		r.addError(phase, err.Error())
		return err
	}
	st, err := o.Daemon.Status(ctx)
	if err != nil {
		return fail("preflight", fmt.Errorf("read the daemon's status: %w", err))
	}
	var names []string
	for _, p := range st.Profiles {
		names = append(names, p.Name)
	}
	for _, name := range []string{o.A, o.B} {
		i := slices.IndexFunc(st.Profiles, func(p api.ProfileInfo) bool { return p.Name == name })
		if i < 0 {
			return fail("preflight", fmt.Errorf("%w: %q (the daemon at %s has %s)", ErrUnknownProfile, name, o.Daemon.BaseURL, strings.Join(names, ", ")))
		}
		p := st.Profiles[i]
		sb.Profiles = append(sb.Profiles, SwitchProfile{Name: p.Name, Backend: string(p.Backend), Model: p.Model,
			ServedName: p.ServedModelName(), Unit: p.Unit, Args: p.Args})
	}
	sr.a, sr.b = sb.Profiles[0], sb.Profiles[1]
	f := &r.Fingerprint
	f.Backend = sr.a.Backend + "," + sr.b.Backend
	f.Model = sr.a.ServedName + "," + sr.b.ServedName
	f.URL = o.Daemon.BaseURL + "/v1"
	if g := st.GPU; g != nil {
		f.Driver, f.CUDA, f.GPUBackend = g.DriverVersion, g.CUDADriverVersion, g.Backend
		if d, ok := g.Device0(); ok {
			f.GPUName, f.GPUMemoryMiB = d.Name, d.MemoryTotalMiB
		}
	} else if st.GPUError != "" {
		f.FingerprintNote = append(f.FingerprintNote, "GPU facts unavailable: "+st.GPUError)
	}
	for _, d := range [][2]SwitchProfile{{sr.a, sr.b}, {sr.b, sr.a}} {
		if why := requestUnreachable(st.Profiles, d[0], d[1]); why != "" && sb.RequestPath == RequestPathMeasured {
			sr.skipRequestPath(why)
		}
	}
	sr.total = sr.planned(o.Rounds)

	// A first, unmeasured, so that every round starts from the same state.
	if st.State.Phase != api.PhaseActive || st.State.Profile != o.A {
		now := "the daemon was " + string(st.State.Phase)
		if st.State.Phase == api.PhaseActive {
			now = st.State.Profile + " was active"
		}
		var failed string
		err := o.Daemon.SwitchAndFollow(ctx, api.SwitchRequest{Profile: o.A}, func(e api.Event) {
			sr.lastSeq = max(sr.lastSeq, e.Seq)
			if e.Kind == api.EventStep && e.Status == api.StatusFailed && failed == "" {
				failed = e.Step
			}
		})
		if err != nil {
			at := ""
			if failed != "" {
				at = " at step " + failed
			}
			return fail("prepare", fmt.Errorf("make %s active before the first round (%s): the switch failed%s: %w", o.A, now, at, err))
		}
		r.Notes = append(r.Notes, fmt.Sprintf("%s was made active before the first round (%s); that switch is not measured", o.A, now))
	}

	for round := 1; round <= o.Rounds; round++ {
		for _, path := range []string{PathSwitch, PathRequest} {
			for _, d := range [][2]SwitchProfile{{sr.a, sr.b}, {sr.b, sr.a}} {
				if path == PathRequest && sb.RequestPath != RequestPathMeasured {
					continue
				}
				s, err := sr.sample(ctx, round, path, d[0], d[1])
				if errors.Is(err, errAutoSwitchOff) {
					sr.skipRequestPath(fmt.Sprintf("the daemon's proxy.auto_switch is off (a /v1 request for %s while %s was active got 404 model_not_loaded); "+
						"enable proxy.auto_switch to measure it", d[1].ServedName, d[0].Name))
					sr.total = sr.done + sr.planned(o.Rounds-round)
					continue
				}
				if err != nil {
					return fail(path, fmt.Errorf("%s → %s (round %d, %s path): %w", d[0].Name, d[1].Name, round, path, err))
				}
				sb.Samples = append(sb.Samples, s)
				sr.step(fmt.Sprintf("round %d/%d: %s → %s, %s path, %s", round, o.Rounds, d[0].Name, d[1].Name, path, s.Mode))
			}
		}
	}
	return nil
}

// planned is the number of samples of rounds more rounds.
func (sr *switchRunner) planned(rounds int) int {
	if sr.r.Switch.RequestPath == RequestPathMeasured {
		return 4 * rounds
	}
	return 2 * rounds
}

func (sr *switchRunner) step(msg string) {
	sr.done++
	if sr.o.Progress != nil {
		sr.o.Progress(Progress{Phase: PhaseSwitch, Done: sr.done, Total: sr.total, Message: msg})
	}
}

func (sr *switchRunner) skipRequestPath(why string) {
	sb := sr.r.Switch
	sb.RequestPath, sb.RequestPathNote = RequestPathSkipped, why
	sr.r.Notes = append(sr.r.Notes, "request path not measured: "+why)
}

// requestUnreachable says why a /v1 request naming to's model, sent while
// from is active, would not switch to to ("" when it would): the proxy
// serves it from from when from answers to that name too, and otherwise
// switches to the first profile by name that serves it.
func requestUnreachable(profiles []api.ProfileInfo, from, to SwitchProfile) string {
	name := to.ServedName
	if from.ServedName == name || from.Model == name {
		return fmt.Sprintf("%s and %s both answer to the model name %s, so a request for it is served by the active one without a switch", from.Name, to.Name, name)
	}
	for _, p := range profiles {
		if p.Name < to.Name && (p.ServedModelName() == name || p.Model == name) {
			return fmt.Sprintf("profile %s also serves %s and comes first, so a request for it switches to %s, not %s", p.Name, name, p.Name, to.Name)
		}
	}
	return ""
}

// errAutoSwitchOff: the proxy answered a request for a model that is not
// loaded with 404 model_not_loaded, i.e. proxy.auto_switch is off.
var errAutoSwitchOff = errors.New("proxy.auto_switch is off")

// followed is what a switch's events showed.
type followed struct {
	id     string
	target string
	evs    []api.Event
	err    error // the switch's own failure, or a failure to follow it
}

// follow reads the events at path until the switch id ends (id "": the
// first switch that starts after it) and returns that switch's events.
func (sr *switchRunner) follow(ctx context.Context, path, id string) followed {
	f := followed{id: id}
	ended := false
	err := sr.o.Daemon.Events(ctx, path, func(e api.Event) bool {
		if f.id == "" && e.Kind == api.EventSwitch && e.Status == api.StatusStarted {
			f.id = e.SwitchID
		}
		if f.id == "" || e.SwitchID != f.id {
			return true
		}
		if e.Kind == api.EventSwitch && e.Status == api.StatusStarted {
			f.target = e.Profile
		}
		f.evs = append(f.evs, e)
		if e.Kind == api.EventSwitch && (e.Status == api.StatusDone || e.Status == api.StatusFailed) {
			ended = true
			if e.Status == api.StatusFailed {
				f.err = switchFailure(f.evs, e.Message)
			}
			return false
		}
		return true
	})
	if !ended {
		if err == nil {
			err = errors.New("the event stream ended before the switch finished")
		}
		f.err = fmt.Errorf("follow the switch's events: %w", err)
	}
	return f
}

// switchFailure names the step a switch failed at.
func switchFailure(evs []api.Event, msg string) error {
	for _, e := range evs {
		if e.Kind == api.EventStep && e.Status == api.StatusFailed {
			return fmt.Errorf("the switch failed at step %s: %s (%s)", e.Step, e.Message, msg)
		}
	}
	return fmt.Errorf("the switch failed: %s", msg)
}

// sample measures one switch from from to to on path.
func (sr *switchRunner) sample(parent context.Context, round int, path string, from, to SwitchProfile) (SwitchSample, error) {
	s := SwitchSample{Round: round, From: from.Name, To: to.Name, Path: path}
	ctx, cancel := context.WithTimeout(parent, sr.o.Timeout)
	defer cancel()
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	evCh := make(chan followed, 1)
	var t0 time.Time
	var tok *sample
	var reqErr error
	if path == PathSwitch {
		t0 = time.Now()
		acc, err := sr.o.Daemon.Switch(ctx, api.SwitchRequest{Profile: to.Name})
		if err != nil {
			return s, fmt.Errorf("POST /api/switch {\"profile\": %q}: %w", to.Name, err)
		}
		s.AcceptedMS = ms(time.Since(t0))
		go func() { evCh <- sr.follow(evCtx, acc.Events, acc.SwitchID) }()
		tok, reqErr = sr.firstToken(ctx, to)
	} else {
		go func() { evCh <- sr.follow(evCtx, "/api/events?since="+strconv.FormatUint(sr.lastSeq, 10), "") }()
		tok, reqErr = sr.firstToken(ctx, to)
		if tok != nil {
			t0 = tok.start
		}
		var he *HTTPError
		if errors.As(reqErr, &he) && he.Status == http.StatusNotFound && he.Code == "model_not_loaded" {
			return s, errAutoSwitchOff
		}
	}
	var f followed
	if reqErr != nil {
		// The switch's own failure says more than the held request's 503:
		// on the switch path wait for its end (it was accepted); on the
		// request path a switch that failed has ended before the answer,
		// so its events are there at once, and there may be none at all.
		if path == PathSwitch {
			f = <-evCh // ends with the switch, or with the sample's timeout
		} else {
			select {
			case f = <-evCh:
			case <-time.After(2 * time.Second):
			}
		}
		if f.err != nil && f.id != "" {
			return s, fmt.Errorf("switch %s: %w", f.id, f.err)
		}
		return s, fmt.Errorf("the /v1 request for %s: %w", to.ServedName, reqErr)
	}
	select {
	case f = <-evCh:
	case <-time.After(switchEventGrace):
		return s, fmt.Errorf("the request for %s got its first token, but no switch to %s finished in the events within %s", to.ServedName, to.Name, switchEventGrace)
	}
	for _, e := range f.evs {
		sr.lastSeq = max(sr.lastSeq, e.Seq)
	}
	switch {
	case f.err != nil:
		return s, fmt.Errorf("switch %s: %w", orDash(f.id), f.err)
	case f.target != to.Name:
		return s, fmt.Errorf("the request for %s switched to profile %s, not %s", to.ServedName, f.target, to.Name)
	}
	s.SwitchID, s.Mode, s.Steps = f.id, SwitchMode(f.evs), switchSteps(f.evs)
	for _, e := range f.evs {
		if e.Kind == api.EventSwitch && e.Status == api.StatusDone {
			s.SwitchMS = e.DurationMS
		}
	}
	s.FirstTokenMS = ms(tok.start.Add(tok.tokenAt[0]).Sub(t0))
	return s, nil
}

// firstToken sends the streamed /v1 request to to's model; it fails
// without a generated token.
func (sr *switchRunner) firstToken(ctx context.Context, to SwitchProfile) (*sample, error) {
	ep := &endpoint{hc: sr.hc, api: strings.TrimRight(sr.o.Daemon.BaseURL, "/") + "/v1", key: sr.o.Daemon.Token, model: to.ServedName}
	s, err := ep.chatStream(ctx, chatRequest{Messages: []chatMessage{{Role: "user", Content: "Say hello."}}, MaxTokens: switchMaxTokens})
	if err != nil {
		return s, err
	}
	if len(s.tokenAt) == 0 {
		return s, fmt.Errorf("POST %s/chat/completions: the stream carried no token (finish reason %q)", ep.api, s.finish)
	}
	return s, nil
}
