package inference

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"gpuhost/api"
	"gpuhost/bench"
	"gpuhost/mcp/connector"
	"gpuhost/units"
)

func init() { connector.Register("inference", func() connector.Connector { return &builder{} }) }

// ErrNoDaemon is Build's error outside the daemon: everything these tools
// report (state, units, doctor, bench history) belongs to the running
// appliance.
var ErrNoDaemon = errors.New("inference connector needs the running gpuhost daemon; start it with `gpuhost serve` or remove mcp.connectors.inference")

// Daemon is what this connector reads of the running daemon: only reads,
// there is deliberately no switch or stop. It is defined here, not in the
// connector contract, so that connectors which do not read the daemon do
// not link packages api and bench; internal/mcpview's Daemon implements
// it.
type Daemon interface {
	Status(ctx context.Context) api.Status
	Doctor(ctx context.Context, profile string) api.DoctorReport
	BenchResults() ([]bench.Summary, error)
}

const (
	defaultHealthTimeout = 2 * time.Second
	// daemonTimeout bounds Status and Doctor, which ask systemd and NVML.
	daemonTimeout = 20 * time.Second
	// defaultBenchLimit and maxBenchLimit bound inference_bench_latest so a
	// long history does not flood the model's context.
	defaultBenchLimit = 5
	maxBenchLimit     = 20
)

// config is the inference section of mcp.connectors.
type config struct {
	// HealthTimeout bounds the probe of the active backend's health
	// endpoint (default 2s): a backend that does not answer that fast is
	// reported unhealthy rather than stalling the tool call.
	HealthTimeout time.Duration `yaml:"health_timeout"`
}

type builder struct{}

// Build returns inference_status, inference_profiles, inference_doctor and
// inference_bench_latest. There is deliberately no tool that switches or
// stops a backend (DESIGN decision 1: tools only read).
func (c *builder) Build(env connector.Env) ([]connector.Tool, error) {
	cfg := config{HealthTimeout: defaultHealthTimeout}
	if err := connector.DecodeConfig(env, &cfg); err != nil {
		return nil, err
	}
	if cfg.HealthTimeout <= 0 || cfg.HealthTimeout > time.Minute {
		return nil, fmt.Errorf("mcp.connectors.%s.health_timeout %v: want more than 0 and at most 1m", env.Name, cfg.HealthTimeout)
	}
	if env.Daemon == nil {
		return nil, ErrNoDaemon
	}
	d, ok := env.Daemon.(Daemon)
	if !ok {
		return nil, fmt.Errorf("inference connector: the daemon (%T) cannot report status, doctor and bench results; remove mcp.connectors.inference", env.Daemon)
	}
	client := env.HTTP
	if client == nil {
		client = &http.Client{}
	}
	t := &tools{d: d, http: client, healthTimeout: cfg.HealthTimeout}

	// The profile enum comes from the daemon's configuration, read once:
	// profiles only change with a daemon restart.
	ctx, cancel := context.WithTimeout(context.Background(), daemonTimeout)
	defer cancel()
	for _, p := range d.Status(ctx).Profiles {
		t.profiles = append(t.profiles, p.Name)
	}
	sort.Strings(t.profiles)

	ro := []mcpgo.ToolOption{mcpgo.WithReadOnlyHintAnnotation(true), mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithOpenWorldHintAnnotation(false), mcpgo.WithSchemaAdditionalProperties(false)}
	opts := func(o ...mcpgo.ToolOption) []mcpgo.ToolOption {
		return append(append([]mcpgo.ToolOption{}, ro...), o...)
	}

	doctorOpts := opts(mcpgo.WithDescription("Run gpuhost's doctor: checks of the GPU, driver, systemd units and every profile's settings " +
		"(or only one profile's), each with severity ok/warn/fail, a message and a suggested fix. worst is the overall verdict."))
	var doctorTargets *connector.Targets
	if len(t.profiles) > 0 {
		doctorOpts = append(doctorOpts, mcpgo.WithString("profile", mcpgo.Enum(t.profiles...),
			mcpgo.Description("Check only this profile (omit for all)")))
		// Profiles are this connector's targets: `gpuhost mcp test` runs
		// the doctor once per profile.
		doctorTargets = &connector.Targets{Param: "profile", Values: append([]string(nil), t.profiles...)}
	}
	return []connector.Tool{
		{Def: mcpgo.NewTool("inference_status", opts(mcpgo.WithDescription(
			"Which inference profile is active on this box (phase idle/switching/active/failed), its model and served name, "+
				"whether its HTTP endpoint answers its health check right now, the backend systemd units' states, every GPU with the "+
				"profiles served on it (their backends hold its memory), its memory and the profiles placed there, the last switch, and "+
				"on a box whose profiles run on several GPU sets (lanes) each lane with its GPUs, phase, profile and endpoint health."))...),
			Handler: t.status},
		{Def: mcpgo.NewTool("inference_profiles", opts(mcpgo.WithDescription(
			"List the configured inference profiles: name, backend (vllm/ollama), model, served model name, port, unit, the GPUs it runs on, and which one is active."))...),
			Handler: t.listProfiles},
		{Def: mcpgo.NewTool("inference_doctor", doctorOpts...), Handler: t.doctor, Targets: doctorTargets},
		{Def: mcpgo.NewTool("inference_bench_latest", opts(mcpgo.WithDescription(
			"The most recent benchmark runs on this box, newest first: profile, model, backend, GPU, driver and mean prefill/decode "+
				"tokens per second by length."),
			mcpgo.WithInteger("limit", mcpgo.Min(1), mcpgo.Max(maxBenchLimit), mcpgo.DefaultNumber(defaultBenchLimit),
				mcpgo.Description("How many runs to return (default 5)")))...),
			Handler: t.benchLatest},
	}, nil
}

type tools struct {
	d             Daemon
	http          *http.Client
	healthTimeout time.Duration
	profiles      []string
}

// StatusResult is inference_status's answer.
type StatusResult struct {
	Phase     api.Phase `json:"phase"`
	Profile   string    `json:"profile,omitempty"`
	Target    string    `json:"switching_to,omitempty"`
	Step      string    `json:"step,omitempty"`
	Error     string    `json:"error,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	Since     time.Time `json:"since"`
	// Active describes the active (or current) profile, nil when idle.
	Active *ProfileView `json:"active,omitempty"`
	// Endpoint is the live health probe of Active's port.
	Endpoint *Health    `json:"endpoint,omitempty"`
	Units    []UnitView `json:"units"`
	// GPUs are the box's GPUs, each with what serves on it: the
	// profiles whose backends hold memory there and those placed there.
	GPUs []GPUView `json:"gpus"`
	// Lanes are the GPU sets the profiles run on, each serving on its
	// own, on a box with several (absent on a box of one: the fields
	// above are its one lane). The fields above are GPU 0's lane's.
	Lanes      []LaneView         `json:"lanes,omitempty"`
	LastSwitch *api.SwitchSummary `json:"last_switch,omitempty"`
	Note       string             `json:"note,omitempty"`
}

// GPUView is one GPU as inference_status shows it, so that the model
// can tell which model serves on which card.
type GPUView struct {
	Index          int    `json:"index"`
	UUID           string `json:"uuid"`
	Name           string `json:"name"`
	MemoryUsedMiB  uint64 `json:"memory_used_mib"`
	MemoryTotalMiB uint64 `json:"memory_total_mib"`
	// Serving are the profiles whose backend holds memory on this GPU
	// now (a profile over several GPUs is on each; one in standby holds
	// its residual).
	Serving []string `json:"serving"`
	// Holders are the processes holding memory, with their backend unit
	// and profile (neither for a process that is not gpuhost's).
	Holders []api.GPUHolder `json:"holders"`
	// Placed are the profiles the config places on this GPU (a fixed
	// gpus set, or GPU 0 when unset); auto profiles go where they fit.
	Placed []string `json:"placed,omitempty"`
	// Line is the GPU in one line, as `gpuhost status` prints it.
	Line string `json:"line"`
}

// LaneView is one lane (a GPU set and the profiles placed on it) as
// inference_status shows it: what serves there now.
type LaneView struct {
	// Lane names the GPU set: "GPU 1", "GPU 0+1".
	Lane    string    `json:"lane"`
	GPUs    []int     `json:"gpus"`
	Phase   api.Phase `json:"phase"`
	Profile string    `json:"profile,omitempty"`
	Target  string    `json:"switching_to,omitempty"`
	Step    string    `json:"step,omitempty"`
	Error   string    `json:"error,omitempty"`
	// Standby are the profiles the lane keeps asleep, ready to wake.
	Standby []string `json:"standby,omitempty"`
	// NotServing says why the lane's wanted profile does not serve.
	NotServing string `json:"not_serving,omitempty"`
	// Endpoint is the live health probe of the profile active there.
	Endpoint *Health `json:"endpoint,omitempty"`
	// Line is the lane in one line, as `gpuhost status` prints it.
	Line string `json:"line"`
}

// laneViews are the status's lanes, each active one's endpoint probed
// (GPU 0's lane's probe is the status's own, not asked twice).
func (t *tools) laneViews(ctx context.Context, st api.Status, gpu0 *Health) []LaneView {
	var out []LaneView
	for i, l := range st.State.Lanes {
		v := LaneView{Lane: l.Lane, GPUs: l.GPUs, Phase: l.Phase, Profile: l.Profile, Step: l.Step, Error: l.Error,
			NotServing: l.NotServing, Line: api.LaneLine(l)}
		if l.Phase == api.PhaseSwitching {
			v.Target = l.Target
		}
		for _, sb := range l.Standby {
			v.Standby = append(v.Standby, sb.Profile)
		}
		if p, ok := profileNamed(st.Profiles, l.Profile); ok && l.Phase == api.PhaseActive {
			if i == 0 && gpu0 != nil {
				v.Endpoint = gpu0
			} else {
				h := t.probe(ctx, p.Backend, p.Port)
				v.Endpoint = &h
			}
		}
		out = append(out, v)
	}
	return out
}

// profileNamed finds a profile of the status by name.
func profileNamed(ps []api.ProfileInfo, name string) (api.ProfileInfo, bool) {
	for _, p := range ps {
		if name != "" && p.Name == name {
			return p, true
		}
	}
	return api.ProfileInfo{}, false
}

// gpuViews are the status's GPUs as inference_status shows them.
func gpuViews(gs []api.GPUStatus) []GPUView {
	out := make([]GPUView, 0, len(gs))
	for _, g := range gs {
		v := GPUView{Index: g.Index, UUID: g.UUID, Name: g.Name, MemoryUsedMiB: g.MemoryUsedMiB, MemoryTotalMiB: g.MemoryTotalMiB,
			Serving: []string{}, Holders: g.Holders, Placed: g.Profiles, Line: g.Line()}
		if v.Holders == nil {
			v.Holders = []api.GPUHolder{}
		}
		for _, h := range g.Holders {
			if h.Profile != "" && !contains(v.Serving, h.Profile) {
				v.Serving = append(v.Serving, h.Profile)
			}
		}
		out = append(out, v)
	}
	return out
}

// ProfileView is a profile as the model needs it (no argv).
type ProfileView struct {
	Name       string        `json:"name"`
	Backend    units.Backend `json:"backend"`
	Model      string        `json:"model"`
	ServedName string        `json:"served_name"`
	Port       int           `json:"port"`
	Unit       string        `json:"unit"`
	// GPUs is where the profile runs as configured: "[0]", "[0, 1]" or
	// "auto".
	GPUs   string `json:"gpus"`
	Active bool   `json:"active"`
}

// UnitView is one backend unit's state.
type UnitView struct {
	Name        string    `json:"name"`
	LoadState   string    `json:"load_state"`
	ActiveState string    `json:"active_state"`
	SubState    string    `json:"sub_state"`
	Result      string    `json:"result,omitempty"`
	MainPID     int       `json:"main_pid,omitempty"`
	NRestarts   int       `json:"n_restarts"`
	ActiveSince time.Time `json:"active_since,omitzero"`
}

// Health is one probe of a backend's readiness endpoint.
type Health struct {
	URL       string  `json:"url"`
	Healthy   bool    `json:"healthy"`
	HTTPCode  int     `json:"http_status,omitempty"`
	LatencyMS float64 `json:"latency_ms"`
	Error     string  `json:"error,omitempty"`
}

func view(p api.ProfileInfo) ProfileView {
	return ProfileView{Name: p.Name, Backend: p.Backend, Model: p.Model, ServedName: p.ServedName, Port: p.Port, Unit: p.Unit, GPUs: p.GPUs, Active: p.Active}
}

func (t *tools) status(ctx context.Context, _ connector.Args) (any, error) {
	dctx, cancel := context.WithTimeout(ctx, daemonTimeout)
	st := t.d.Status(dctx)
	cancel()
	out := StatusResult{Phase: st.State.Phase, Profile: st.State.Profile, Step: st.State.Step, Error: st.State.Error,
		LastError: st.State.LastError, Since: st.State.Since, LastSwitch: st.LastSwitch, Units: []UnitView{}, GPUs: gpuViews(st.GPUs)}
	if st.State.Phase == api.PhaseSwitching {
		out.Target = st.State.Target
	}
	for _, u := range st.Units {
		out.Units = append(out.Units, UnitView{Name: u.Name, LoadState: u.LoadState, ActiveState: u.ActiveState, SubState: u.SubState,
			Result: u.Result, MainPID: u.MainPID, NRestarts: u.NRestarts, ActiveSince: u.ActiveEnterTimestamp})
	}
	for _, p := range st.Profiles {
		if st.State.Profile != "" && p.Name == st.State.Profile {
			v := view(p)
			out.Active = &v
		}
	}
	switch {
	case out.Active != nil:
		h := t.probe(ctx, out.Active.Backend, out.Active.Port)
		out.Endpoint = &h
	case st.State.Phase == api.PhaseIdle && len(st.State.Lanes) == 0:
		out.Note = "no inference backend is running; an operator starts one with `gpuhost switch <profile>`"
	}
	out.Lanes = t.laneViews(ctx, st, out.Endpoint)
	if out.Active == nil && len(out.Lanes) > 0 && !slices.ContainsFunc(out.Lanes, func(l LaneView) bool { return l.Phase != api.PhaseIdle }) {
		out.Note = "no inference backend is running on any GPU set; an operator starts one with `gpuhost switch <profile>`"
	}
	return out, nil
}

// probe asks the backend's own readiness endpoint on loopback. The address
// comes from the daemon's config, never from the model.
func (t *tools) probe(ctx context.Context, b units.Backend, port int) Health {
	h := Health{URL: "http://127.0.0.1:" + strconv.Itoa(port) + units.HealthPath(b)}
	ctx, cancel := context.WithTimeout(ctx, t.healthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.URL, nil)
	if err != nil {
		h.Error = fmt.Sprintf("building the health request: %v", err)
		return h
	}
	start := time.Now()
	resp, err := t.http.Do(req)
	h.LatencyMS = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			h.Error = fmt.Sprintf("no answer within %v", t.healthTimeout)
		} else {
			h.Error = fmt.Sprintf("not reachable: %v", err)
		}
		return h
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	h.HTTPCode = resp.StatusCode
	h.Healthy = resp.StatusCode >= 200 && resp.StatusCode < 300
	if !h.Healthy {
		h.Error = "health check answered " + resp.Status
	}
	return h
}

// ProfilesResult is inference_profiles's answer.
type ProfilesResult struct {
	Profiles []ProfileView `json:"profiles"`
}

func (t *tools) listProfiles(ctx context.Context, _ connector.Args) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, daemonTimeout)
	defer cancel()
	out := ProfilesResult{Profiles: []ProfileView{}}
	for _, p := range t.d.Status(ctx).Profiles {
		out.Profiles = append(out.Profiles, view(p))
	}
	return out, nil
}

func (t *tools) doctor(ctx context.Context, args connector.Args) (any, error) {
	profile := args.String("profile")
	if profile != "" && !contains(t.profiles, profile) {
		return nil, fmt.Errorf("unknown profile %q: choose one of %s, or omit profile to check all", profile, strings.Join(t.profiles, ", "))
	}
	ctx, cancel := context.WithTimeout(ctx, daemonTimeout)
	defer cancel()
	return t.d.Doctor(ctx, profile), nil
}

// BenchResult is inference_bench_latest's answer.
type BenchResult struct {
	Results []bench.Summary `json:"results"`
	Total   int             `json:"total"`
	Note    string          `json:"note,omitempty"`
}

func (t *tools) benchLatest(_ context.Context, args connector.Args) (any, error) {
	limit := defaultBenchLimit
	if n, ok := args.Number("limit"); ok {
		if n < 1 || n > maxBenchLimit || n != float64(int(n)) {
			return nil, fmt.Errorf("limit %v: want a whole number from 1 to %d", n, maxBenchLimit)
		}
		limit = int(n)
	}
	all, err := t.d.BenchResults()
	if err != nil {
		return nil, fmt.Errorf("reading the benchmark results failed: %w", err)
	}
	sorted := append([]bench.Summary(nil), all...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].StartedAt.After(sorted[j].StartedAt) })
	out := BenchResult{Results: []bench.Summary{}, Total: len(sorted)}
	if len(sorted) > limit {
		sorted = sorted[:limit]
	}
	out.Results = append(out.Results, sorted...)
	if len(all) == 0 {
		out.Note = "no benchmark has been run on this box yet; an operator runs one with `gpuhost bench run`"
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
