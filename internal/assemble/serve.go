package assemble

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"
	"github.com/labstack/echo/v4"
	"golang.org/x/net/netutil"

	"gpuhost/agent"
	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/bench"
	"gpuhost/bench/benchapi"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/frontdoor/metrics"
	"gpuhost/frontdoor/panel"
	"gpuhost/frontdoor/proxy"
	"gpuhost/frontdoor/telegram"
	"gpuhost/internal/activity"
	"gpuhost/internal/frontdoor"
	"gpuhost/internal/mcpview"
	"gpuhost/mcp"
	"gpuhost/nvml"
	"gpuhost/units"
)

// Options are what the daemon needs beyond its config: the build's version
// (reported by MCP and stored with bench results) and, when set, a function
// called with the address once the API serves (the demo prints its banner).
type Options struct {
	Version string
	Ready   func(addr string)
}

// Serve is the daemon (`gpuhost serve` and `gpuhost demo`): the one place
// that wires config, GPU, units, Supervisor, front doors, services and
// systemd notification together. It returns when ctx ends (SIGTERM) or the
// listener fails.
func Serve(ctx context.Context, cfg *config.Config, log *slog.Logger, o Options) error {
	c, closeCore := OpenCore(ctx, cfg, log)
	defer closeCore()
	c.version = o.Version
	var err error
	if c.api, err = httpapi.New(c.Sup, c.Doctor, log); err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// Listen before building the services: the agent and the triage worker
	// talk to the daemon's own /v1, whose port is known only now (listen
	// ":0" in tests). Connections wait in the backlog until Serve.
	ln, err := listen(cfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	selfV1 := loopbackV1(ln.Addr())
	selfClient := &http.Client{Transport: &selfAuth{base: selfV1, cfg: cfg, next: http.DefaultTransport}}
	// The front doors: each can be disabled, and one failing does not stop
	// the others or the backend (docs/design.md decision 6).
	px, m := c.startProxy(runCtx)
	defer px.Close()
	act := c.startActivity(runCtx, px)
	bsvc, bstore := c.startBench()
	defer bsvc.Close()
	ms := c.startMCP(runCtx, bstore)
	// The agent loop: the MCP registry's read-only tools on the box's own
	// model, behind one limiter shared by the API, the panel and the bot.
	asker := newAgent(runCtx, cfg, ms, selfV1, selfClient, log.With("component", "agent"))
	agent.Register(c.api, asker, log.With("component", "agent"))
	p := c.startPanel(asker, benchPanel{bsvc, bstore}, act)
	c.startTelegram(runCtx, asker)
	if tw, closeTW := c.startTriageWorker(runCtx, ms, selfV1, selfClient, m); tw != nil {
		defer closeTW()
		if p != nil {
			p.SetMail(tw) // the Mail page; built after the panel, so set now
		}
	}
	return c.run(ctx, runCtx, ln, o.Ready)
}

// Core is what every entry point builds first (Serve, and the commands that
// read the box locally: `gpuhost mcp` without a daemon) and every front door
// and service is wired to: the config, the log, the Supervisor, the doctor,
// and the HTTP API's server (httpapi.New's) where each registers its routes.
type Core struct {
	cfg *config.Config
	log *slog.Logger
	// Sup is the one Box of this process: a switch engine per lane.
	Sup *appliance.Box
	// Doctor runs the doctor with everything the Supervisor knows (the
	// Telegram bot's status, the exclusion watcher's findings).
	Doctor api.DoctorFunc
	api    *echo.Echo
	// journal reads a backend unit's last log lines (the panel's logs page).
	journal appliance.JournalFunc
	version string
}

// OpenCore opens the GPU and the units (each failure logged: the daemon
// serves anyway) and builds the Supervisor and the doctor on them. A nil log
// opens quietly (a command that only reads). close closes the Supervisor,
// the units and the GPU, in that order.
func OpenCore(ctx context.Context, cfg *config.Config, log *slog.Logger) (c *Core, closeAll func()) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gpu, closeGPU, gerr := openGPU(cfg)
	if gerr != nil {
		log.Error("GPU facts unavailable; serving anyway, switches will fail at the VRAM check", "err", gerr)
	}
	u, journal, closeUnits, uerr := appliance.OpenUnits(ctx, cfg)
	if uerr != nil {
		log.Error("systemd unreachable; serving anyway and retrying", "socket", cfg.Systemd.Socket, "err", uerr)
	}
	sup := appliance.NewBox(cfg, gpu, u, journal, log)
	doctor := func(ctx context.Context, profile string) api.DoctorReport {
		d := &appliance.Doctor{Cfg: cfg, GPU: gpu, Units: u, Profile: profile, Telegram: sup.TelegramStatus, Exclusion: sup.Exclusion, Gate: sup, Watcher: sup,
			LaneGate: func(l config.Lane) appliance.ProbeGate { return sup.Lane(l.Slot) }}
		if gerr != nil {
			d.GPU, d.GPUErr = nil, gerr
		}
		if uerr != nil {
			d.Units, d.UnitsErr = nil, uerr
		}
		return d.Run(ctx)
	}
	return &Core{cfg: cfg, log: log, Sup: sup, Doctor: doctor, journal: journal}, func() {
		defer closeGPU()
		defer closeUnits()
		sup.Close()
	}
}

// openGPU is the one call of the GPU opener (appliance.OpenGPU): the
// core's, a triage worker's power reading and bench's GPU facts all go
// through it.
func openGPU(cfg *config.Config) (appliance.GPU, func(), error) { return appliance.OpenGPU(cfg) }

// LocalSnapshot reads this box's GPU once without a daemon (`gpuhost
// bench` records the GPU beside each result).
func LocalSnapshot(ctx context.Context, cfg *config.Config) (nvml.Snapshot, error) {
	gpu, closeGPU, err := openGPU(cfg)
	defer closeGPU()
	if err != nil {
		return nvml.Snapshot{}, err
	}
	return gpu.Snapshot(ctx)
}

// LocalStatus reads this box's status without a daemon (`gpuhost status`
// when none answers): one reconcile of a Supervisor that runs nothing.
func LocalStatus(ctx context.Context, cfg *config.Config) api.Status {
	c, closeCore := OpenCore(ctx, cfg, nil)
	defer closeCore()
	c.Sup.Reconcile(ctx)
	return c.Sup.Status(ctx)
}

// LocalDoctor checks this box without a daemon (`gpuhost doctor` when none
// answers), with the same doctor the daemon runs.
func LocalDoctor(ctx context.Context, cfg *config.Config, profile string) api.DoctorReport {
	c, closeCore := OpenCore(ctx, cfg, nil)
	defer closeCore()
	// One reconcile, so the doctor's probe gate knows which profile is
	// active (it lets probes reach only that one).
	c.Sup.Reconcile(ctx)
	return c.Doctor(ctx, profile)
}

// listen opens the API's listener on cfg.Listen, limited to
// http.max_connections in all and http.max_connections_per_client for each
// client (every loopback address being one).
func listen(cfg *config.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (listen): %w", cfg.Listen, err)
	}
	// Connections beyond http.max_connections wait in the kernel's backlog
	// until one closes, so idle keep-alive floods cannot exhaust fds.
	// A client past its own cap is answered 503 and closed without taking
	// one of them.
	return netutil.LimitListener(frontdoor.LimitPerClient(ln, cfg.HTTP.MaxConnectionsPerClient), cfg.HTTP.MaxConnections), nil
}

// startProxy builds the /v1 proxy and, unless metrics.disabled, the
// metrics (run until ctx ends, observing the proxy); m is nil without
// them. The caller closes px.
func (c *Core) startProxy(ctx context.Context) (px *proxy.Proxy, m *metrics.Metrics) {
	cfg, log := c.cfg, c.log
	px = proxy.New(c.Sup, cfg.Proxy, func() map[string]*units.Profile { return cfg.Profiles }, log.With("component", "proxy"))
	if len(c.Sup.Lanes()) > 1 {
		px.SetLanes(func(profile string) proxy.Backend { return c.Sup.LaneOf(profile) })
	}
	px.DialBackends(c.backendDialer())
	// A switch drains the requests running on the backend it takes away
	// through the proxy, which forwards them.
	c.Sup.SetDrainer(px)
	if !cfg.Metrics.Disabled {
		m = metrics.New(c.Sup, c.Doctor, log.With("component", "metrics"))
		go m.Run(ctx)
		m.Register(c.api)
		px.SetObserver(m)
		if err := m.Add(px.Collectors()...); err != nil {
			log.Error("proxy metrics not exported", "err", err)
		}
	}
	px.Register(c.api) // no-op when proxy.disabled
	return px, m
}

// startActivity records the proxy's requests and samples the GPU every
// 2 s (until ctx ends) for the panel's Activity page; nil when the panel is
// disabled, as nothing else reads it.
func (c *Core) startActivity(ctx context.Context, px *proxy.Proxy) *activity.Recorder {
	if c.cfg.Panel.Disabled {
		return nil
	}
	act := activity.New(activity.Options{LogSize: c.cfg.Panel.ActivityRequests, GPU: c.Sup, Events: c.Sup,
		Log: c.log.With("component", "activity")})
	go act.Run(ctx)
	px.SetRecorder(act)
	return act
}

// startPanel serves the web panel unless panel.disabled; a panel that
// cannot start is logged and left out (nil).
func (c *Core) startPanel(asker *agent.Limiter, bp benchPanel, act *activity.Recorder) *panel.Panel {
	cfg := c.cfg
	if cfg.Panel.Disabled {
		return nil
	}
	d := panel.Daemon{Listen: cfg.Listen, APIToken: cfg.APIToken, APITokenEnv: cfg.APITokenEnv,
		AuthFailuresPerMinute: cfg.HTTP.AuthFailuresPerMinute, Profiles: cfg.Profiles,
		Journal: panel.JournalFunc(c.journal), DialBackend: c.backendDialer().DialContext}
	for _, bu := range cfg.BackendUnits() {
		d.Units = append(d.Units, bu.Name)
	}
	p, err := panel.New(c.Sup, c.Doctor, d, c.log.With("component", "panel"))
	if err != nil {
		c.log.Error("web panel not started; the daemon carries on", "err", err)
		return nil
	}
	p.SetBench(bp)
	p.SetAsker(asker)
	if act != nil {
		p.SetActivity(act)
	}
	p.Register(c.api)
	return p
}

// startTelegram runs the Telegram bot until ctx ends when telegram.enabled;
// a bot that cannot start or stops is logged, and its status says so.
func (c *Core) startTelegram(ctx context.Context, asker *agent.Limiter) {
	if !c.cfg.Telegram.Enabled {
		return
	}
	log := c.log
	d := telegram.Daemon{StateDir: c.cfg.StateDir, Profiles: c.cfg.Profiles, AskEvery: c.cfg.Agent.TelegramEvery.D(),
		DialBackend: c.backendDialer().DialContext}
	tb, err := telegram.New(c.cfg.Telegram, d, c.Sup, c.Doctor, log.With("component", "telegram"))
	if err != nil {
		log.Error("telegram bot not started; the daemon carries on", "err", err)
		c.Sup.SetTelegramStatus(telegram.StoppedStatus(err, time.Now()))
		return
	}
	c.Sup.SetTelegramStatus(tb.Status)
	tb.SetAsker(asker)
	go func() {
		if err := tb.Run(ctx); err != nil {
			log.Error("telegram bot stopped; the daemon carries on", "err", err)
		}
	}()
}

// run serves the API on ln and runs the Supervisor until ctx ends or
// either fails, then tells systemd it is stopping and shuts the server
// down (5 s). runCtx is what the Supervisor and the systemd notifier run
// under. ready, when set, is called with the address once serving.
func (c *Core) run(ctx, runCtx context.Context, ln net.Listener, ready func(addr string)) error {
	cfg, sup, log := c.cfg, c.Sup, c.log
	// No ReadTimeout or WriteTimeout: answers stream for minutes. Request
	// bodies get http.body_read_timeout and each write of an answer
	// http.write_timeout from the front-door guard instead.
	srv := &http.Server{Handler: c.api, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: cfg.HTTP.IdleTimeout.D(), MaxHeaderBytes: cfg.HTTP.MaxHeaderBytes}
	errc := make(chan error, 2)
	// The Supervisor starts reconciling before the first request is
	// answered (requests may have queued while the services were built).
	go func() {
		if err := sup.Run(runCtx); err != nil {
			errc <- fmt.Errorf("supervisor: %w", err)
		}
	}()
	go func() { errc <- srv.Serve(ln) }()
	addr := ln.Addr().String()
	log.Info("gpuhost serving", "addr", addr, "gpu", cfg.GPU.Backend, "runner", cfg.Systemd.Runner, "profiles", len(cfg.Profiles))
	if ready != nil {
		ready(addr)
	}
	go notifySystemd(runCtx, sup, log)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	_, _ = sd.SdNotify(false, sd.SdNotifyStopping)
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}

// notifySystemd sends READY=1, keeps the watchdog fed at half its interval
// and keeps STATUS= current (one line, e.g. "active: qwen3-coder (vllm) ·
// 18.4/24.0 GiB"). Without NOTIFY_SOCKET every call is a no-op.
func notifySystemd(ctx context.Context, sup *appliance.Box, log *slog.Logger) {
	// READY=1 only after the first reconcile (and the restore switch's
	// start), as the unit file says: earlier, a switch would see "idle".
	select {
	case <-sup.Ready():
	case <-ctx.Done():
		return
	}
	status := func() string {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var snapPtr *nvml.Snapshot
		if snap, err := sup.Snapshot(sctx); err == nil {
			snapPtr = &snap
		}
		st := sup.State()
		line := api.StatusLine(st, snapPtr)
		// systemctl status shows one line: every other lane in it too.
		for _, l := range st.Lanes[min(1, len(st.Lanes)):] {
			line += "; " + l.Lane + ": " + api.StatusLine(l, nil)
		}
		return line
	}
	if sent, err := sd.SdNotify(false, sd.SdNotifyReady+"\nSTATUS="+status()); err != nil {
		log.Warn("sd_notify READY failed", "err", err)
	} else if !sent {
		return // not under systemd Type=notify
	}
	interval, _ := sd.SdWatchdogEnabled(false)
	var wd <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval / 2)
		defer t.Stop()
		wd = t.C
	}
	evs, _, cancel := sup.Subscribe(sup.LastSeq())
	defer cancel()
	refresh := time.NewTicker(30 * time.Second)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wd:
			_, _ = sd.SdNotify(false, sd.SdNotifyWatchdog)
		case <-evs:
			_, _ = sd.SdNotify(false, "STATUS="+status())
		case <-refresh.C:
			_, _ = sd.SdNotify(false, "STATUS="+status())
		}
	}
}

// benchPanel gives the panel's Bench page the stored runs and the service.
type benchPanel struct {
	*benchapi.Service
	store *bench.Store
}

func (b benchPanel) List() ([]*bench.Result, []bench.Warning, error) { return b.store.List() }

// LocalMCP builds `gpuhost mcp` run without a daemon: the core over this
// box's GPU and units as the gpu and inference connectors' view, and the
// MCP server's one constructor over cfg. With run it also runs the
// Supervisor (the demo: its default profile starts); without, it only
// reads (one reconcile).
func LocalMCP(ctx context.Context, cfg *config.Config, log *slog.Logger, version string, run bool) mcp.Setup {
	c, closeCore := OpenCore(ctx, cfg, log)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	if run {
		go func() { _ = c.Sup.Run(runCtx); close(done) }()
	} else {
		c.Sup.Reconcile(ctx)
		close(done)
	}
	d := &mcpview.Daemon{Sup: c.Sup, DoctorFn: c.Doctor, Bench: bench.NewStore(cfg.StateDir, nil)}
	return mcp.Setup{
		Build: func(mlog *slog.Logger) (*mcp.Server, error) { return newMCPServer(cfg, mlog, version, d) },
		Close: func() {
			cancel()
			<-done
			closeCore()
		},
	}
}
