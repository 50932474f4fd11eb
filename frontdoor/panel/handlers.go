package panel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/nvml"
	"gpuhost/units"
)

// Timeouts of the outside calls a page view makes.
const (
	statusTimeout = 10 * time.Second
	probeTimeout  = 2 * time.Second
	doctorWait    = 15 * time.Second
)

// endpointView is the active backend's health as the dashboard shows it.
type endpointView struct {
	URL     string
	OK      bool
	Code    int
	Latency string
	Error   string
}

// dashboardView is the body of the dashboard.
type dashboardView struct {
	Status   api.Status
	Snapshot *nvml.Snapshot
	// Lanes are one per GPU; none when the GPU facts are unavailable.
	Lanes []laneView
	// Several: the box has more than one GPU, so each lane also says who
	// holds memory on it and which profiles are placed there (on one GPU
	// the Backend card says it).
	Several  bool
	Active   *api.ProfileInfo
	Endpoint *endpointView
}

func (p *Panel) handleDashboard(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), statusTimeout)
	defer cancel()
	st := p.sup.Status(ctx)
	v := dashboardView{Status: st, Snapshot: st.GPU, Lanes: lanes(st)}
	v.Several = len(v.Lanes) > 1
	for i := range st.Profiles {
		// With several lanes the Backend card is GPU 0's lane's: another
		// lane's active profile is on its GPU cards.
		if st.Profiles[i].Active && (len(st.State.Lanes) == 0 || st.Profiles[i].Name == st.State.Profile) {
			v.Active = &st.Profiles[i]
		}
	}
	if st.State.Phase == api.PhaseActive {
		if prof, ok := p.daemon.Profiles[st.State.Profile]; ok {
			ev := p.probe(ctx, prof)
			v.Endpoint = &ev
		}
	}
	return p.render(c, http.StatusOK, "dashboard", p.pageData(c, "dashboard", "Dashboard", v))
}

// probe asks the active backend's health endpoint once, with a short
// timeout: the dashboard shows whether clients get answers right now.
func (p *Panel) probe(ctx context.Context, prof *units.Profile) endpointView {
	ev := endpointView{URL: "http://127.0.0.1:" + strconv.Itoa(prof.Port) + units.HealthPath(prof.Backend)}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ev.URL, nil)
	if err != nil {
		ev.Error = fmt.Sprintf("build health request for %s: %v", ev.URL, err)
		return ev
	}
	t0 := time.Now()
	resp, err := p.probeClient.Do(req)
	if err != nil {
		ev.Error = fmt.Sprintf("GET %s: %v", ev.URL, err)
		return ev
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	ev.Code = resp.StatusCode
	ev.Latency = formatDuration(float64(time.Since(t0).Microseconds()) / 1000)
	if ev.Latency == "" {
		ev.Latency = "< 1 ms"
	}
	ev.OK = resp.StatusCode == http.StatusOK
	if !ev.OK {
		ev.Error = fmt.Sprintf("GET %s: status %d", ev.URL, resp.StatusCode)
	}
	return ev
}

// flag is one key setting of a profile, shown as name=value.
type flag struct{ Name, Value string }

// profileRow is one profile on the profiles page.
type profileRow struct {
	api.ProfileInfo
	Aliases []string
	Flags   []flag
	Verdict verdict
	// Standby is the mode ("sleep1", "unload", …) when the profile's
	// backend is in standby now: it shows as such, not as down.
	Standby string
	// LaneGPUs are the GPUs of the profile's lane ("0", "0,1"): after a
	// switch to it the script clears the active mark of the profiles on
	// lanes sharing one of them only.
	LaneGPUs string
}

// noticeView is a message above the profiles table (a refused switch).
type noticeView struct {
	Kind    string // error, info
	Message string
	Checks  []string
	// ForceProfile offers "switch anyway" for a doctor refusal.
	ForceProfile string
}

// profilesView is the body of the profiles page.
type profilesView struct {
	// Groups are the profiles by GPU set (GPU 0, GPU 1, GPU 0+1, auto),
	// each with its Switch buttons.
	Groups    []profileGroup
	Progress  *progressView
	Notice    *noticeView
	DoctorAt  time.Time
	DoctorRan bool
	// DoctorOff: no doctor was wired in, so there are no verdicts.
	DoctorOff bool
	// Lanes: the box serves on several GPU sets at once, so a switch
	// changes the active mark of its own lane (and those sharing its
	// GPUs) only.
	Lanes bool
}

func keyFlags(p *units.Profile) []flag {
	var fs []flag
	switch p.Backend {
	case units.VLLM:
		f := p.VLLM
		gmu := "default"
		if f.GPUMemoryUtilization > 0 {
			gmu = strconv.FormatFloat(f.GPUMemoryUtilization, 'f', -1, 64)
		}
		fs = append(fs, flag{"gpu_memory_utilization", gmu})
		if f.MaxNumSeqs > 0 {
			fs = append(fs, flag{"max_num_seqs", strconv.Itoa(f.MaxNumSeqs)})
		}
		if f.MaxModelLen > 0 {
			fs = append(fs, flag{"max_model_len", strconv.Itoa(f.MaxModelLen)})
		}
		if f.ToolCallParser != "" {
			fs = append(fs, flag{"tool_call_parser", f.ToolCallParser})
		}
		if f.Quantization != "" {
			fs = append(fs, flag{"quantization", f.Quantization})
		}
		if f.KVCacheDtype != "" {
			fs = append(fs, flag{"kv_cache_dtype", f.KVCacheDtype})
		}
	case units.Ollama:
		if p.Ollama.NumCtx > 0 {
			fs = append(fs, flag{"num_ctx", strconv.Itoa(p.Ollama.NumCtx)})
		}
		fs = append(fs, flag{"keep_alive", p.Ollama.EffectiveKeepAlive()})
	}
	return fs
}

func (p *Panel) profileRows(ctx context.Context, refreshDoctor bool) ([]profileRow, time.Time, bool) {
	st := p.sup.State()
	rep, at := p.doctorCache.get(ctx, refreshDoctor, stateKey(st))
	vs := verdicts(rep)
	asleep := map[string]string{}
	for _, l := range append([]api.State{st}, st.Lanes...) {
		for _, sb := range l.Standby {
			asleep[sb.Profile] = sb.Mode
		}
	}
	var rows []profileRow
	for _, info := range p.sup.Profiles() {
		row := profileRow{ProfileInfo: info, Verdict: vs[info.Name], Standby: asleep[info.Name], LaneGPUs: gpuKey(laneGPUs(nil))}
		if prof, ok := p.daemon.Profiles[info.Name]; ok {
			row.LaneGPUs = gpuKey(laneGPUs(prof))
			row.Flags = keyFlags(prof)
			row.Aliases = prof.Aliases
		}
		if rep != nil && row.Verdict.Severity == "" {
			row.Verdict.Severity = "ok"
		}
		rows = append(rows, row)
	}
	return rows, at, rep != nil
}

// switchIDRE bounds what ?switch= may hold (ids are short hex strings).
var switchIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (p *Panel) handleProfiles(c echo.Context) error {
	return p.renderProfiles(c, http.StatusOK, nil)
}

// renderProfiles shows the profiles page, with the progress of the switch
// named by ?switch= (or of the one running now) and an optional notice.
func (p *Panel) renderProfiles(c echo.Context, code int, notice *noticeView) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), doctorWait)
	defer cancel()
	st := p.sup.State()
	v := profilesView{Notice: notice, DoctorOff: p.doctor == nil, Lanes: len(st.Lanes) > 0}
	id := c.QueryParam("switch")
	if id != "" && !switchIDRE.MatchString(id) {
		id = ""
		if v.Notice == nil {
			v.Notice = &noticeView{Kind: "error", Message: "The switch id in the address is malformed."}
			code = http.StatusBadRequest
		}
	}
	if id == "" {
		id = runningSwitch(st)
	}
	if id != "" {
		_, backlog, unsubscribe := p.sup.Subscribe(0)
		unsubscribe()
		pv := buildProgress(id, backlog, p.befores.get(id), st)
		if !pv.Found {
			pv.Outcome, pv.Result = "unknown", fmt.Sprintf("switch %s is not in the event buffer (it keeps the most recent events only)", id)
		}
		v.Progress = &pv
	}
	var rows []profileRow
	rows, v.DoctorAt, v.DoctorRan = p.profileRows(ctx, false)
	v.Groups = groupRows(rows, p.profileSets())
	return p.render(c, code, "profiles", p.pageData(c, "profiles", "Profiles", v))
}

// switchAccepted answers the panel's fetch: where to follow the switch.
type switchAccepted struct {
	SwitchID  string `json:"switch_id"`
	Profile   string `json:"profile"`
	Backend   string `json:"backend"`
	Events    string `json:"events"`
	Since     uint64 `json:"since"`
	BeforeMiB int64  `json:"before_mib"`
	Location  string `json:"location"`
}

// handleSwitch starts a switch from the Switch button: JSON for the
// script (which then follows /api/events), a redirect to the progress page
// for a plain form POST.
func (p *Panel) handleSwitch(c echo.Context) error {
	profile := c.FormValue("profile")
	force := c.FormValue("force") == "1"
	before := p.usedBefore(c.Request().Context(), profile)
	since := p.sup.LastSeq()
	id, _, err := p.sup.Switch(c.Request().Context(), profile, api.SwitchOptions{Force: force})
	var be *api.BusyError
	var de *api.DoctorError
	switch {
	case errors.Is(err, api.ErrUnknownProfile):
		return p.switchRefused(c, err, &noticeView{Kind: "error",
			Message: fmt.Sprintf("There is no profile %q; profiles: %s.", profile, strings.Join(slices.Sorted(maps.Keys(p.daemon.Profiles)), ", "))})
	case errors.As(err, &be):
		return p.switchRefused(c, err, &noticeView{Kind: "error",
			Message: fmt.Sprintf("A switch to %s is already running (step %s); wait for it to finish.", be.Target, be.Step)})
	case errors.As(err, &de):
		n := &noticeView{Kind: "error", ForceProfile: profile,
			Message: fmt.Sprintf("Profile %s fails the doctor's settings checks, so the switch was not started.", profile)}
		for _, ch := range de.Checks {
			n.Checks = append(n.Checks, ch.ID+": "+ch.Message)
		}
		return p.switchRefused(c, err, n)
	case err != nil:
		p.log.Error("switch not started", "profile", profile, "err", err)
		return p.switchRefused(c, err, &noticeView{Kind: "error",
			Message: "The switch did not start: " + err.Error()})
	}
	p.befores.put(id, before)
	p.log.Info("switch requested from the panel", "profile", profile, "switch", id, "force", force, "remote", c.RealIP())
	loc := "/profiles?switch=" + urlQueryEscape(id)
	if !wantsJSON(c) {
		return c.Redirect(http.StatusSeeOther, loc)
	}
	backend := ""
	if prof, ok := p.daemon.Profiles[profile]; ok {
		backend = string(prof.Backend)
	}
	return c.JSON(http.StatusAccepted, switchAccepted{
		SwitchID: id, Profile: profile, Backend: backend, Since: since, BeforeMiB: before, Location: loc,
		Events: "/api/events?since=" + strconv.FormatUint(since, 10),
	})
}

// usedBefore is the memory used, before a switch to profile, on the GPU
// its VRAM-release step reports (the first of its lane's): the "from" of
// "VRAM released x → y GiB". -1 when it cannot be read.
func (p *Panel) usedBefore(ctx context.Context, profile string) int64 {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	snap, err := p.sup.Snapshot(ctx)
	if err != nil {
		return -1
	}
	first := 0 // a box of one lane reports GPU 0
	if len(p.sup.State().Lanes) > 0 {
		first = laneGPUs(p.daemon.Profiles[profile])[0]
	}
	for _, d := range snap.Devices {
		if d.Index == first {
			return int64(d.MemoryUsedMiB)
		}
	}
	return -1
}

// switchRefused answers a switch that did not start: JSON (with the
// doctor's checks) for the script, the profiles page with a notice for a
// form POST.
func (p *Panel) switchRefused(c echo.Context, err error, n *noticeView) error {
	code, short := api.SwitchErrorStatus(err)
	if wantsJSON(c) {
		var extra any
		if len(n.Checks) > 0 || n.ForceProfile != "" {
			extra = map[string]any{"checks": n.Checks, "force_profile": n.ForceProfile}
		}
		return c.JSON(code, api.APIError{Error: short, Detail: n.Message, Extra: extra})
	}
	return p.renderProfiles(c, code, n)
}

// doctorView is the body of the doctor page.
type doctorView struct {
	Report *api.DoctorReport
	// Checks are the report's checks worst first (fail, warn, ok), in the
	// doctor's order within a severity: the one failure is the first row,
	// not the 23rd.
	Checks    []api.DoctorCheck
	At        time.Time
	Counts    map[string]int
	DoctorOff bool
	// State is what the checks were read against: the active profile,
	// those in standby, or the switch under way.
	State api.State
}

func (p *Panel) handleDoctor(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), doctorWait)
	defer cancel()
	st := p.sup.State()
	rep, at := p.doctorCache.get(ctx, c.QueryParam("refresh") == "1", stateKey(st))
	v := doctorView{Report: rep, At: at, Counts: map[string]int{}, DoctorOff: p.doctor == nil, State: st}
	if rep != nil {
		for _, ch := range rep.Checks {
			v.Counts[string(ch.Severity)]++
		}
		v.Checks = worstFirst(rep.Checks)
	}
	return p.render(c, http.StatusOK, "doctor", p.pageData(c, "doctor", "Doctor", v))
}
