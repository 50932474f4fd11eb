package assemble

import (
	"context"
	"errors"
	"fmt"
	"gpuhost/nvml"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"gpuhost/agent"
	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/bench"
	"gpuhost/bench/benchapi"
	"gpuhost/config"
	"gpuhost/frontdoor/metrics"
	"gpuhost/internal/loopback"
	"gpuhost/internal/mcpview"
	"gpuhost/mcp"
	"gpuhost/mcp/declarative"
	"gpuhost/triage"
)

// loopbackV1 is the daemon's own OpenAI-compatible base URL as seen from
// inside the box: a wildcard listen address is reached over 127.0.0.1
// (loopback.DialHost).
func loopbackV1(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/v1"
	}
	return "http://" + net.JoinHostPort(loopback.DialHost(host), port) + "/v1"
}

// selfAuth adds the daemon's bearer token to requests the daemon makes to
// its own /v1 (agent, triage) when it listens beyond loopback and therefore
// demands the token. The token is read per request, never stored or logged;
// requests to any other URL are left alone.
type selfAuth struct {
	base string
	cfg  *config.Config
	next http.RoundTripper
}

func (s *selfAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.cfg.IsLoopback() || !strings.HasPrefix(r.URL.String(), s.base) {
		return s.next.RoundTrip(r)
	}
	if h := r.Header.Get("Authorization"); h != "" && h != "Bearer" && h != "Bearer " {
		return s.next.RoundTrip(r) // a configured key wins
	}
	tok, err := s.cfg.APIToken()
	if err != nil || tok == "" {
		return s.next.RoundTrip(r) // the API answers 401/503 with its reason
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+tok)
	return s.next.RoundTrip(r)
}

// newAgent builds the agent loop on the MCP server's in-process client.
// It returns nil (every front door then answers "agent disabled") when the
// agent is off by config or MCP is not running.
func newAgent(ctx context.Context, cfg *config.Config, ms *mcp.Server, selfV1 string, hc *http.Client, log *slog.Logger) *agent.Limiter {
	if cfg.Agent.Disabled {
		return nil
	}
	if ms == nil {
		log.Error("agent not started: it needs the MCP server (mcp.disabled or MCP failed to start); the daemon carries on")
		return nil
	}
	cl, err := ms.InProcessClient(ctx)
	if err != nil {
		log.Error("agent not started; the daemon carries on", "err", err)
		return nil
	}
	go func() { <-ctx.Done(); _ = cl.Close() }()
	ac := cfg.Agent
	base := ac.BaseURL
	if base == "" {
		base = selfV1
	}
	key := ""
	if ac.APIKeyEnv != "" {
		if key = os.Getenv(ac.APIKeyEnv); key == "" {
			log.Error("agent.api_key_env names an empty or unset variable; asking without a key", "variable", ac.APIKeyEnv)
		}
	}
	return agent.NewLimiter(agent.New(cl, agent.Options{
		BaseURL: base, Model: ac.Model, APIKey: key, HTTPClient: hc,
		MaxSteps: ac.MaxSteps, MaxTokens: ac.MaxTokens, MaxQuestionBytes: ac.MaxQuestionBytes,
		Deadline: ac.Deadline.D(), ToolTimeout: ac.ToolTimeout.D(), Log: log,
	}), agent.DefaultMaxConcurrent)
}

// TriageSources are what the triage worker reads beyond its config: the
// daemon's running Supervisor when it runs inside `gpuhost serve`, the
// daemon's API and a locally opened GPU when `gpuhost triage` runs beside it.
type TriageSources struct {
	Log *slog.Logger
	// ActiveModel names the model the box serves now ("" = the default
	// profile's).
	ActiveModel func() string
	// Snapshot reads the GPU, for pricing a local model's energy; nil: no
	// energy in the price.
	Snapshot func(context.Context) (nvml.Snapshot, error)
	// MCP is the server whose crm connector the customer lookup calls when
	// triage.crm.enabled.
	MCP *mcp.Server
	// ManagedBaseURL and HTTPClient reach the daemon's own /v1 (empty: the
	// triage config's own base URL or the default listen address).
	ManagedBaseURL string
	HTTPClient     *http.Client
}

// OpenTriage builds the triage worker from the config and its sources, the
// one way `gpuhost serve` and `gpuhost triage` both do. close closes the MCP
// client and the worker's mail source.
func OpenTriage(ctx context.Context, cfg *config.Config, src TriageSources) (*triage.Worker, func(), error) {
	deps := triage.Deps{Log: src.Log, ManagedBaseURL: src.ManagedBaseURL, HTTPClient: src.HTTPClient,
		ActiveModel: src.ActiveModel, Power: powerFrom(src.Snapshot)}
	var closeMCP func()
	if cfg.Triage.CRM.Enabled {
		if src.MCP == nil {
			return nil, nil, errors.New("triage.crm.enabled: the MCP server is not running (mcp.disabled or it failed to start), so the crm connector cannot be called")
		}
		cl, err := src.MCP.InProcessClient(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("triage.crm: MCP client for the crm connector: %w", err)
		}
		closeMCP = func() { _ = cl.Close() }
		deps.MCP = cl
	}
	tw, err := triage.FromConfig(ctx, cfg.Triage, triageDaemon(cfg), deps)
	if err != nil {
		if closeMCP != nil {
			closeMCP()
		}
		return nil, nil, err
	}
	return tw, func() {
		if err := tw.Close(); err != nil {
			src.Log.Warn("triage: closing the mail source", "err", err)
		}
		if closeMCP != nil {
			closeMCP()
		}
	}, nil
}

// OpenTriageBeside builds the triage worker of the `gpuhost triage`
// commands, beside (or without) a running daemon: the same worker as
// OpenTriage, its GPU power reading from this box's GPU (local model
// only) and, for triage.crm, the MCP server from the daemon's one
// constructor (no view of the box: the crm connector needs none).
// activeModel follows the daemon's active profile. close closes the
// worker, the MCP client and the GPU.
func OpenTriageBeside(ctx context.Context, cfg *config.Config, log *slog.Logger, version string, activeModel func() string) (*triage.Worker, func(), error) {
	src := TriageSources{Log: log.With("component", "triage"), ActiveModel: activeModel}
	closeGPU := func() {}
	if cfg.Triage.Model.BaseURL == "" {
		// Local model: its energy is priced from the GPU's power draw.
		gpu, closeFn, gerr := openGPU(cfg)
		closeGPU = closeFn
		if gerr != nil {
			log.Warn("triage: no GPU power reading; local model calls are priced without energy", "err", gerr)
		} else {
			src.Snapshot = gpu.Snapshot
		}
	}
	if cfg.Triage.CRM.Enabled {
		mlog := log.With("component", "mcp")
		ms, err := newMCPServer(cfg, mlog, version, nil)
		if err != nil {
			closeGPU()
			return nil, nil, fmt.Errorf("triage.crm needs the MCP crm connector: %w", err)
		}
		logDisabled(ms, mlog)
		src.MCP = ms
	}
	w, closeW, err := OpenTriage(ctx, cfg, src)
	if err != nil {
		closeGPU()
		return nil, nil, err
	}
	return w, func() { closeW(); closeGPU() }, nil
}

// powerFrom prices a local model's energy from the GPU's power draw; nil
// without a GPU reading.
func powerFrom(snapshot func(context.Context) (nvml.Snapshot, error)) func(context.Context) (float64, bool) {
	if snapshot == nil {
		return nil
	}
	return func(ctx context.Context) (float64, bool) {
		snap, err := snapshot(ctx)
		if err != nil {
			return 0, false
		}
		d, ok := snap.Device0()
		return d.PowerW, ok && d.PowerW > 0
	}
}

// activeModel is the served name of the Supervisor's active profile, ""
// while switching or idle (api.ActiveServedName).
func activeModel(cfg *config.Config, sup *appliance.Box) func() string {
	return func() string { return api.ActiveServedName(sup.State(), api.ProfilesIn(cfg.Profiles)) }
}

// triageDaemon is what the triage worker needs from gpuhost.yaml besides
// its triage: section.
func triageDaemon(cfg *config.Config) triage.Daemon {
	d := triage.Daemon{StateDir: cfg.StateDir, Listen: cfg.Listen, Telegram: cfg.Telegram}
	if p := cfg.Profiles[cfg.DefaultProfile]; p != nil {
		d.DefaultModel = p.ServedModelName()
	}
	return d
}

// runTriage runs the triage worker; when it classifies with the managed
// model (no triage.model.base_url) its first poll waits for the first
// active profile, so the demo's worker does not fail (and log an ERROR)
// while the default profile is still loading.
func runTriage(ctx context.Context, cfg *config.Config, sup *appliance.Box, tw *triage.Worker, log *slog.Logger) error {
	if cfg.Triage.Model.BaseURL == "" {
		if st := sup.State(); st.Phase != api.PhaseActive || st.Step != "" {
			log.Info("triage: waiting for the first active profile before polling", "phase", st.Phase)
		}
		if err := sup.AwaitFirstActive(ctx); err != nil {
			return nil // shutting down
		}
	}
	return tw.Run(ctx)
}

// startBench builds the benchmarks of the active profile (POST
// /api/bench), their progress on the event bus. The caller closes bsvc.
func (c *Core) startBench() (bsvc *benchapi.Service, bstore *bench.Store) {
	sup := c.Sup
	bstore = bench.NewStore(c.cfg.StateDir, c.log.With("component", "bench"))
	bstore.MaxResults, bstore.MaxBytes = c.cfg.Bench.MaxResults, c.cfg.Bench.MaxBytes
	bsvc = benchapi.NewService(benchapi.ServiceOptions{
		Store: bstore,
		Daemon: benchapi.DaemonFuncs{
			SwitchingFunc:   func() bool { return sup.State().Phase == api.PhaseSwitching },
			AwaitActiveFunc: sup.AwaitActive,
		},
		GPU:            sup.Snapshot,
		GpuhostVersion: c.version,
		Publish:        func(msg string) { sup.Publish(api.Event{Kind: api.EventBench, Message: msg}) },
		Log:            c.log.With("component", "bench"),
		// The daemon measures the backend itself, through its socket under systemd.
		Defaults: bench.Options{Dial: c.backendDialer().DialContext},
	})
	bsvc.Register(c.api)
	return bsvc, bstore
}

// startMCP serves MCP over streamable HTTP at /mcp unless mcp.disabled:
// read-only connectors, the same bearer token as the API beyond loopback,
// the declarative connectors reloaded while ctx lasts. nil (logged) when
// disabled or it cannot start; the daemon carries on.
func (c *Core) startMCP(ctx context.Context, bstore *bench.Store) *mcp.Server {
	cfg := c.cfg
	if cfg.MCP.Disabled {
		return nil
	}
	mlog := c.log.With("component", "mcp")
	ms, err := newMCPServer(cfg, mlog, c.version, &mcpview.Daemon{Sup: c.Sup, DoctorFn: c.Doctor, Bench: bstore})
	if err != nil {
		mlog.Error("MCP server not started; the daemon carries on", "err", err)
		return nil
	}
	logDisabled(ms, mlog)
	ms.Register(c.api)
	go declarative.Watch(ctx, cfg.MCP.ConnectorsDir, func() {
		extra, errs := declarative.Load(cfg.MCP.ConnectorsDir)
		for _, e := range errs {
			mlog.Error("declarative connector skipped", "err", e)
		}
		ms.ReloadExtra(extra)
	})
	return ms
}

// newMCPServer is the one construction of the MCP server, for the daemon
// and for a triage worker run beside it: the configured and declarative
// connectors, the session cap, connectors' HTTP through the backend
// dialer, d as the connectors' view of the box (nil: none, so gpu and
// inference are disabled). The caller logs the disabled connectors
// (`gpuhost mcp` does so itself).
func newMCPServer(cfg *config.Config, mlog *slog.Logger, version string, d *mcpview.Daemon) (*mcp.Server, error) {
	extra, errs := declarative.Load(cfg.MCP.ConnectorsDir)
	for _, e := range errs {
		mlog.Error("declarative connector skipped", "err", e)
	}
	// Connectors dial as usual, except that the inference connector's probe
	// of the active backend reaches it through its socket under systemd.
	mtr := http.DefaultTransport.(*http.Transport).Clone()
	mtr.DialContext = backendDialer(cfg).DialContext
	o := mcp.ServerOptions{
		Config: cfg.MCP.Connectors, Extra: extra, Log: mlog, Version: version, MaxSessions: cfg.MCP.MaxSessions,
		HTTP: &http.Client{Timeout: mcp.DefaultCallTimeout, Transport: mtr},
	}
	if d != nil {
		o.Daemon = d
	}
	return mcp.NewServer(o)
}

// logDisabled logs the connectors the server left out, and why.
func logDisabled(ms *mcp.Server, mlog *slog.Logger) {
	for name, why := range ms.Disabled() {
		mlog.Error("MCP connector disabled", "connector", name, "reason", why)
	}
}

// startTriageWorker builds the triage worker when triage.enabled, registers
// its routes and metrics (m may be nil) and runs it until ctx ends. nil
// when disabled or it cannot start (logged: the rest of the daemon carries
// on); the caller closes the worker with the returned function.
func (c *Core) startTriageWorker(ctx context.Context, ms *mcp.Server, selfV1 string, selfClient *http.Client, m *metrics.Metrics) (*triage.Worker, func()) {
	cfg, sup, log := c.cfg, c.Sup, c.log.With("component", "triage")
	if !cfg.Triage.Enabled {
		return nil, nil
	}
	tw, closeTW, err := OpenTriage(ctx, cfg, TriageSources{Log: log, ActiveModel: activeModel(cfg, sup),
		Snapshot: sup.Snapshot, MCP: ms, ManagedBaseURL: selfV1, HTTPClient: selfClient})
	if err != nil {
		log.Error("triage worker not started; the daemon carries on", "err", err)
		return nil, nil
	}
	tw.Register(c.api)
	if m != nil {
		if err := m.Add(tw.Collectors()...); err != nil {
			log.Error("triage metrics not exported", "err", err)
		}
	}
	go func() {
		if err := runTriage(ctx, cfg, sup, tw, log); err != nil {
			log.Error("triage worker stopped; the daemon carries on", "err", err)
		}
	}()
	return tw, closeTW
}

// backendDialer reaches the backends' ports: through each backend's unix
// socket under systemd (its 127.0.0.1 is in a private network), loopback
// TCP under the process runner. Every client of the daemon that talks to
// a backend directly dials through it.
func (c *Core) backendDialer() *loopback.Dialer { return backendDialer(c.cfg) }

func backendDialer(cfg *config.Config) *loopback.Dialer {
	return &loopback.Dialer{Sockets: cfg.BackendSockets()}
}
