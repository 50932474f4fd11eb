package main

import (
	"context"
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
	"gpuhost/internal/wiring"
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

// startTriage builds the triage worker from the config; nil (logged) when
// it cannot start, so the rest of the daemon carries on.
func startTriage(ctx context.Context, cfg *config.Config, sup *appliance.Supervisor, ms *mcp.Server, selfV1 string, hc *http.Client, log *slog.Logger) *triage.Worker {
	deps := triage.Deps{
		Log:            log,
		ManagedBaseURL: selfV1,
		HTTPClient:     hc,
		ActiveModel: func() string {
			st := sup.State()
			if p := cfg.Profiles[st.Profile]; p != nil && st.Phase == api.PhaseActive {
				return p.ServedName
			}
			return ""
		},
		Power: func(ctx context.Context) (float64, bool) {
			snap, err := sup.Snapshot(ctx)
			if err != nil || len(snap.Devices) == 0 || snap.Devices[0].PowerW <= 0 {
				return 0, false
			}
			return snap.Devices[0].PowerW, true
		},
	}
	if cfg.Triage.CRM.Enabled {
		if ms == nil {
			log.Error("triage.crm.enabled but the MCP server is not running; customer lookup is off")
		} else if cl, err := ms.InProcessClient(ctx); err != nil {
			log.Error("triage customer lookup off", "err", err)
		} else {
			go func() { <-ctx.Done(); _ = cl.Close() }()
			deps.MCP = cl
		}
	}
	tw, err := triage.FromConfig(ctx, cfg.Triage, triageDaemon(cfg), deps)
	if err != nil {
		log.Error("triage worker not started; the daemon carries on", "err", err)
		return nil
	}
	return tw
}

// triageDaemon is what the triage worker needs from gpuhost.yaml besides
// its triage: section.
func triageDaemon(cfg *config.Config) triage.Daemon {
	d := triage.Daemon{StateDir: cfg.StateDir, Listen: cfg.Listen, Telegram: cfg.Telegram}
	if p := cfg.Profiles[cfg.DefaultProfile]; p != nil {
		d.DefaultModel = p.ServedName
	}
	return d
}

// runTriage runs the triage worker; when it classifies with the managed
// model (no triage.model.base_url) its first poll waits for the first
// active profile, so the demo's worker does not fail (and log an ERROR)
// while the default profile is still loading.
func runTriage(ctx context.Context, cfg *config.Config, sup *appliance.Supervisor, tw *triage.Worker, log *slog.Logger) error {
	if cfg.Triage.Model.BaseURL == "" {
		if st := sup.State(); st.Phase != api.PhaseActive || st.Step != "" {
			log.Info("triage: waiting for the first active profile before polling", "component", "triage", "phase", st.Phase)
		}
		if err := sup.AwaitFirstActive(ctx); err != nil {
			return nil // shutting down
		}
	}
	return tw.Run(ctx)
}

// startBench builds the benchmarks of the active profile (POST
// /api/bench), their progress on the event bus. The caller closes bsvc.
func (c *core) startBench() (bsvc *benchapi.Service, bstore *bench.Store) {
	sup := c.sup
	bstore = bench.NewStore(c.cfg.StateDir, c.log.With("component", "bench"))
	bsvc = benchapi.NewService(benchapi.ServiceOptions{
		Store: bstore,
		Daemon: benchapi.DaemonFuncs{
			SwitchingFunc:   func() bool { return sup.State().Phase == api.PhaseSwitching },
			AwaitActiveFunc: sup.AwaitActive,
		},
		GPU:            sup.Snapshot,
		GpuhostVersion: version,
		Publish:        func(msg string) { sup.Publish(api.Event{Kind: "bench", Message: msg}) },
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
func (c *core) startMCP(ctx context.Context, bstore *bench.Store) *mcp.Server {
	cfg := c.cfg
	if cfg.MCP.Disabled {
		return nil
	}
	mlog := c.log.With("component", "mcp")
	extra, errs := declarative.Load(cfg.MCP.ConnectorsDir)
	for _, e := range errs {
		mlog.Error("declarative connector skipped", "err", e)
	}
	// Connectors dial as usual, except that the inference connector's probe
	// of the active backend reaches it through its socket under systemd.
	mtr := http.DefaultTransport.(*http.Transport).Clone()
	mtr.DialContext = c.backendDialer().DialContext
	ms, err := mcp.NewServer(mcp.ServerOptions{
		Config: cfg.MCP.Connectors, Extra: extra, Log: mlog, Version: version,
		HTTP:   &http.Client{Timeout: mcp.DefaultCallTimeout, Transport: mtr},
		Daemon: &wiring.MCPDaemon{Sup: c.sup, DoctorFn: c.doctor, Bench: bstore},
	})
	if err != nil {
		mlog.Error("MCP server not started; the daemon carries on", "err", err)
		return nil
	}
	for name, why := range ms.Disabled() {
		mlog.Error("MCP connector disabled", "connector", name, "reason", why)
	}
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

// startTriageWorker builds the triage worker when triage.enabled, registers
// its routes and metrics (m may be nil) and runs it until ctx ends. nil
// when disabled or it cannot start; the caller closes the worker.
func (c *core) startTriageWorker(ctx context.Context, ms *mcp.Server, selfV1 string, selfClient *http.Client, m *metrics.Metrics) *triage.Worker {
	cfg, sup, log := c.cfg, c.sup, c.log
	if !cfg.Triage.Enabled {
		return nil
	}
	tw := startTriage(ctx, cfg, sup, ms, selfV1, selfClient, log.With("component", "triage"))
	if tw == nil {
		return nil
	}
	tw.Register(c.api)
	if m != nil {
		if err := m.Add(tw.Collectors()...); err != nil {
			log.Error("triage metrics not exported", "err", err)
		}
	}
	go func() {
		if err := runTriage(ctx, cfg, sup, tw, log); err != nil {
			log.Error("triage worker stopped; the daemon carries on", "component", "triage", "err", err)
		}
	}()
	return tw
}

// backendDialer reaches the backends' ports: through each backend's unix
// socket under systemd (its 127.0.0.1 is in a private network), loopback
// TCP under the process runner. Every client of the daemon that talks to
// a backend directly dials through it.
func (c *core) backendDialer() *loopback.Dialer {
	return &loopback.Dialer{Sockets: c.cfg.BackendSockets()}
}
