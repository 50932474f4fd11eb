package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// maxRouteRounds bounds how often one request re-routes. A round forwards,
// answers, or waits for a switch; only "nothing runs, start one" and "another
// switch is running, wait for it" lead to another round.
const maxRouteRounds = 6

// busyPoll is how often a request retries a switch that the Supervisor
// refused as busy although no switch shows in its state (the last one is
// recording its end).
const busyPoll = 2 * time.Millisecond

// route picks the profile a request goes to, holding it while a switch runs
// and starting one when auto_switch asks for it (at most one per request).
// requested is the body's "model" ("" = whatever is active). It returns a
// client-facing error when the request cannot be served. With auto_switch
// the request's place in the in-flight count is left in rec.ticket (the
// caller releases it when the forwarding ends), and the anti-thrash policy
// may hold it (gate, admit); those holds do not count as routing rounds.
func (p *Proxy) route(reqCtx context.Context, h *hold, requested string, rec *record) (*units.Profile, *apiErr) {
	switchedTo := ""
	for round := 0; round < maxRouteRounds; round++ {
		profiles := p.profiles()
		st := rec.sup.State()
		var cands []*units.Profile
		if requested != "" {
			cands = candidates(profiles, requested)
			if len(cands) == 0 {
				return nil, p.modelError(http.StatusNotFound, "model_not_found",
					fmt.Sprintf("unknown model %q", requested), profiles, st)
			}
			// Known, so a safe label even if the request ends before it is
			// forwarded.
			rec.model = cands[0].ServedModelName()
		}
		var (
			prof *units.Profile
			aerr *apiErr
			end  roundEnd
		)
		if cur := currentProfile(st); requested == "" || containsProfile(cands, cur) {
			prof, aerr, end = p.routeCurrent(reqCtx, h, rec, requested, cur, switchedTo, st, profiles)
		} else {
			var name string
			name, aerr, end = p.routeSwitch(reqCtx, h, rec, requested, switchedTo, st, profiles, cands)
			if name != "" {
				switchedTo = name
			}
		}
		switch end {
		case roundAnswer:
			return prof, aerr
		case roundHeld:
			round-- // a hold, not a routing round
		}
	}
	return nil, switchIncomplete(requested, "", rec.sup.State())
}

// roundEnd is how one round of route ended.
type roundEnd int

const (
	roundAnswer roundEnd = iota // answer with the profile or the error
	roundAgain                  // route again: another routing round
	roundHeld                   // route again after a hold, which is no routing round
)

// routeCurrent is a round of route for a request that cur (the current
// profile) serves, or that names no model: it waits for cur to be active,
// then forwards to it unless the policy is draining it.
func (p *Proxy) routeCurrent(reqCtx context.Context, h *hold, rec *record, requested, cur, switchedTo string, st api.State, profiles map[string]*units.Profile) (*units.Profile, *apiErr, roundEnd) {
	if rec.pol != nil && st.Phase == api.PhaseSwitching {
		rec.pol.await(rec.sup, cur, rec) // part of the batch the switch releases
	}
	prof, err := p.awaitActive(h, st, profiles, rec)
	if err != nil {
		if rec.pol != nil {
			rec.pol.release(rec)
		}
		if errors.Is(err, api.ErrNoBackend) && requested != "" && p.cfg.AutoSwitch && switchedTo == "" && reqCtx.Err() == nil {
			return nil, nil, roundAgain // the switch we waited for failed: auto_switch may start one
		}
		return nil, holdError(rec.sup.State(), h.context(), reqCtx, err), roundAnswer
	}
	if requested == "" || serves(prof, requested) {
		if rec.pol == nil {
			return prof, nil, roundAnswer
		}
		d, ok := rec.pol.admit(rec.sup, prof.Name, rec)
		switch {
		case !ok:
			// The state moved on since it was read (a switch
			// began): route again, which holds the request.
			return nil, nil, roundAgain
		case d != nil:
			// prof is being drained for a switch away: the
			// request waits for that switch to start, then routes
			// again (it is for another model now).
			if aerr := p.awaitDeparture(reqCtx, h, rec, d); aerr != nil {
				return nil, aerr, roundAnswer
			}
			return nil, nil, roundHeld
		}
		return prof, nil, roundAnswer
	}
	// The switch this request waited for ended with another profile
	// active (it failed and rolled back, or was followed by another).
	return nil, switchIncomplete(requested, cur, rec.sup.State()), roundAnswer
}

// routeSwitch is a round of route for a request for cands, a model that
// the current profile does not serve: with auto_switch it waits for the
// switch under way, is held by the anti-thrash policy, or starts a switch.
// It returns the profile it started a switch to ("" if none).
func (p *Proxy) routeSwitch(reqCtx context.Context, h *hold, rec *record, requested, switchedTo string, st api.State, profiles map[string]*units.Profile, cands []*units.Profile) (string, *apiErr, roundEnd) {
	holdCtx := h.context()
	if !p.cfg.AutoSwitch {
		if st.Phase == api.PhaseIdle || st.Phase == api.PhaseFailed {
			return "", noBackendError(st, fmt.Sprintf("model %q is configured (profile %s) but no backend is running", requested, cands[0].Name)), roundAnswer
		}
		return "", p.modelError(http.StatusNotFound, "model_not_loaded",
			fmt.Sprintf("model %q is not loaded and proxy.auto_switch is off; switch with `gpuhost switch %s` or enable auto_switch", requested, cands[0].Name),
			profiles, st), roundAnswer
	}
	if switchedTo != "" {
		// Our switch ran, yet another profile is current: someone
		// switched away. Switching back would ping-pong the GPU.
		return "", switchIncomplete(requested, switchedTo, st), roundAnswer
	}
	var dep *departure
	if rec.pol != nil && (st.Phase == api.PhaseSwitching || st.Phase == api.PhaseActive && st.Step != "") {
		// A switch (or a backend's restart) is under way: wait for it
		// and route again, so that the policy decides against what it
		// leads to. Asking the Supervisor for a switch now could start
		// one the moment the running one ends, past the policy.
		if _, err := p.awaitActive(h, st, profiles, rec); err != nil && !errors.Is(err, api.ErrNoBackend) {
			return "", holdError(rec.sup.State(), holdCtx, reqCtx, err), roundAnswer
		}
		return "", nil, roundAgain
	}
	if rec.pol != nil && st.Phase == api.PhaseActive {
		// Switching away from a running model: the anti-thrash
		// policy holds the request while that model is resident and
		// lets one request lead the switch once its requests drained.
		d, aerr := p.gate(reqCtx, h, rec, st, cands)
		if aerr != nil {
			return "", aerr, roundAnswer
		}
		if d == nil {
			return "", nil, roundHeld // held, then the state moved on: route again
		}
		dep, holdCtx = d, h.context()
	}
	name, aerr := p.startSwitch(holdCtx, cands, rec)
	if dep != nil {
		p.finish(rec.pol, dep, rec, name, aerr)
	}
	if aerr != nil {
		return "", aerr, roundAnswer
	}
	if name == "" {
		aerr, end := p.awaitBusy(h, reqCtx, profiles, rec)
		return "", aerr, end
	}
	return name, nil, roundAgain
}

// awaitBusy is the round's end for a request whose switch the Supervisor
// refused as busy: it holds the request while the busy switch ends.
func (p *Proxy) awaitBusy(h *hold, reqCtx context.Context, profiles map[string]*units.Profile, rec *record) (*apiErr, roundEnd) {
	holdCtx := h.context()
	if st := rec.sup.State(); st.Phase != api.PhaseSwitching {
		// The busy switch has set its final state (active after a
		// rollback, or failed) but not yet let go of the Supervisor:
		// it is recording its end. Awaiting the state would return
		// at once and spend the rounds in a moment, answering 503
		// without a switch ever being tried; hold the request until
		// the Supervisor is free instead (bounded by hold_timeout).
		t0 := time.Now()
		err := sleepCtx(holdCtx, busyPoll)
		rec.held += time.Since(t0)
		if err != nil {
			return holdError(rec.sup.State(), holdCtx, reqCtx, err), roundAnswer
		}
		return nil, roundHeld // a hold, not a routing round
	}
	// Another switch runs: wait for it, then route again.
	if _, err := p.awaitActive(h, rec.sup.State(), profiles, rec); err != nil && !errors.Is(err, api.ErrNoBackend) {
		return holdError(rec.sup.State(), holdCtx, reqCtx, err), roundAnswer
	}
	return nil, roundAgain
}

// awaitDeparture holds a request for a model being drained until the
// switch away from it has started; the time is the policy's (see gate).
func (p *Proxy) awaitDeparture(reqCtx context.Context, h *hold, rec *record, d *departure) *apiErr {
	rec.pol.deferred.WithLabelValues("drain").Inc()
	t0 := time.Now()
	select {
	case <-d.done:
	case <-reqCtx.Done():
	}
	w := time.Since(t0)
	rec.held += w
	h.extend(w)
	if reqCtx.Err() != nil {
		return clientGoneWhileHeld()
	}
	return nil
}

// switchIncomplete is the 503 for a request whose model a switch was meant
// to load but that is not what runs now.
func switchIncomplete(requested, profile string, st api.State) *apiErr {
	msg := fmt.Sprintf("model %q is not active after the switch", requested)
	if profile != "" {
		msg = fmt.Sprintf("model %q is not active after the switch to profile %s", requested, profile)
	}
	msg += " (now " + describe(st) + ")"
	if st.LastError != "" {
		msg += "; last switch error: " + st.LastError
	}
	return &apiErr{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "switch_incomplete",
		retryAfter: true, msg: msg}
}

// awaitActive returns the active profile; the fast path (active, no switch)
// takes no lock beyond State's and allocates nothing (not even the hold's
// context).
func (p *Proxy) awaitActive(h *hold, st api.State, profiles map[string]*units.Profile, rec *record) (*units.Profile, error) {
	if st.Phase == api.PhaseActive && st.Step == "" {
		if prof := profiles[st.Profile]; prof != nil {
			return prof, nil
		}
	}
	t0 := time.Now()
	prof, err := rec.sup.AwaitActive(h.context())
	rec.held += time.Since(t0)
	return prof, err
}

// startSwitch starts a switch to the first candidate that the Supervisor
// accepts (one that fails the doctor's checks is skipped: auto_switch never
// forces). It returns the profile switched to, or "" when a switch is
// already running, whatever its target: the caller waits for it and routes
// again, which finds a running switch to a candidate as current.
func (p *Proxy) startSwitch(ctx context.Context, cands []*units.Profile, rec *record) (string, *apiErr) {
	var refusals []string
	for _, c := range cands {
		_, _, err := rec.sup.Switch(ctx, c.Name, api.SwitchOptions{})
		var be *api.BusyError
		var de *api.DoctorError
		switch {
		case err == nil:
			rec.switched = true
			p.log.Info("auto_switch: switching for a request", "profile", c.Name, "model", c.ServedModelName())
			return c.Name, nil
		case errors.As(err, &be):
			return "", nil
		case errors.As(err, &de):
			refusals = append(refusals, de.Error())
		case errors.Is(err, api.ErrUnknownProfile):
			refusals = append(refusals, err.Error())
		default:
			return "", &apiErr{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "switch_failed",
				msg: fmt.Sprintf("auto_switch to profile %s could not start: %v", c.Name, err)}
		}
	}
	return "", &apiErr{status: http.StatusConflict, typ: "invalid_request_error", code: "switch_refused",
		msg: "auto_switch refused: " + strings.Join(refusals, "; ")}
}

// currentProfile is the profile requests are routed to now: the active one,
// or the target of the switch in progress.
func currentProfile(st api.State) string {
	switch st.Phase {
	case api.PhaseActive:
		return st.Profile
	case api.PhaseSwitching:
		return st.Target
	}
	return ""
}

// candidates lists the profiles that serve name, sorted by profile name (two
// profiles may share a served name, e.g. the same model with other flags).
func candidates(profiles map[string]*units.Profile, name string) []*units.Profile {
	var out []*units.Profile
	for _, prof := range profiles {
		if prof != nil && serves(prof, name) {
			out = append(out, prof)
		}
	}
	slices.SortFunc(out, func(a, b *units.Profile) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func containsProfile(ps []*units.Profile, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// serves reports whether a request for name may go to prof: its served
// name, an alias, or the model id itself (a Hugging Face id or an Ollama
// tag, which clients sometimes send).
func serves(prof *units.Profile, name string) bool {
	if name == prof.ServedModelName() || name == prof.Model {
		return true
	}
	for _, a := range prof.Aliases {
		if a == name {
			return true
		}
	}
	return false
}

// upstreamName is the model name the backend itself answers to: vLLM's
// --served-model-name, or the Ollama tag.
func upstreamName(prof *units.Profile) string {
	if prof.Backend == units.Ollama {
		return prof.Model
	}
	return prof.ServedModelName()
}

func backendHost(prof *units.Profile) string {
	return "127.0.0.1:" + strconv.Itoa(prof.Port) // net.JoinHostPort's result, in one allocation
}

// holdError turns the end of a hold into an answer: no backend → 503 saying
// why; the hold timed out → 503 with Retry-After; the client left → 499.
func holdError(st api.State, holdCtx, reqCtx context.Context, err error) *apiErr {
	switch {
	case reqCtx.Err() != nil:
		return &apiErr{status: statusClientClosed, msg: "the client went away while the request was held"}
	case errors.Is(err, api.ErrNoBackend):
		return noBackendError(st, "no inference backend is running")
	case holdCtx.Err() != nil:
		return &apiErr{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "hold_timeout", retryAfter: true,
			msg: fmt.Sprintf("the request was held for proxy.hold_timeout while the GPU switched and no backend became ready (%s)", describe(st))}
	}
	return &apiErr{status: http.StatusBadGateway, typ: "upstream_error", code: "backend_unreachable",
		msg: "the inference backend did not answer: " + err.Error()}
}

// noBackendError is the 503 for "nothing runs", naming why.
func noBackendError(st api.State, what string) *apiErr {
	why := "gpuhost is idle: no profile is active (switch to one with `gpuhost switch PROFILE`)"
	if st.Phase == api.PhaseFailed {
		why = "the backend failed: " + st.Error
	} else if st.LastError != "" {
		why += "; last error: " + st.LastError
	}
	return &apiErr{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "no_backend",
		msg: what + ": " + why, extra: map[string]any{"phase": st.Phase}}
}

func describe(st api.State) string {
	switch st.Phase {
	case api.PhaseActive:
		return "active: " + st.Profile
	case api.PhaseSwitching:
		return fmt.Sprintf("switching to %s, step %s", st.Target, st.Step)
	case api.PhaseFailed:
		return "failed: " + st.Error
	}
	return string(st.Phase)
}

// modelError is a 404 (or other) naming what is loaded and what is
// available, so a client's user sees the names to use.
func (p *Proxy) modelError(status int, code, msg string, profiles map[string]*units.Profile, st api.State) *apiErr {
	loaded := ""
	if st.Phase == api.PhaseActive {
		if prof := profiles[st.Profile]; prof != nil {
			loaded = prof.ServedModelName()
		}
	}
	var available []string
	seen := map[string]bool{}
	for _, name := range sortedNames(profiles) {
		prof := profiles[name]
		for _, n := range append([]string{prof.ServedModelName()}, prof.Aliases...) {
			if !seen[n] {
				seen[n] = true
				available = append(available, n)
			}
		}
	}
	full := msg
	if loaded != "" {
		full += "; loaded: " + loaded
	} else {
		full += "; loaded: none (" + describe(st) + ")"
	}
	full += "; available: " + strings.Join(available, ", ")
	return &apiErr{status: status, typ: "invalid_request_error", code: code, param: "model", msg: full,
		extra: map[string]any{"loaded": loaded, "available": available}}
}

func sortedNames(profiles map[string]*units.Profile) []string {
	names := make([]string, 0, len(profiles))
	for n, prof := range profiles {
		if prof != nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}
