package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/net/netutil"

	"gpuhost/agent"
	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/bench"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/frontdoor/metrics"
	"gpuhost/frontdoor/panel"
	"gpuhost/frontdoor/proxy"
	"gpuhost/frontdoor/telegram"
	"gpuhost/internal/wiring"
	"gpuhost/mcp"
	"gpuhost/mcp/declarative"
	"gpuhost/nvml"
	"gpuhost/units"
)

// serve is the daemon: the one place that wires config, GPU, units,
// Supervisor, HTTP API and systemd notification together. It returns when
// ctx ends (SIGTERM) or the listener fails.
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger, ready func(addr string)) error {
	gpu, closeGPU, gerr := appliance.OpenGPU(cfg)
	defer closeGPU()
	if gerr != nil {
		log.Error("GPU facts unavailable; serving anyway, switches will fail at the VRAM check", "err", gerr)
	}
	u, journal, closeUnits, uerr := appliance.OpenUnits(ctx, cfg)
	defer closeUnits()
	if uerr != nil {
		log.Error("systemd unreachable; serving anyway and retrying", "socket", cfg.Systemd.Socket, "err", uerr)
	}
	sup := appliance.NewSupervisor(cfg, gpu, u, journal, log)
	defer sup.Close()
	doctor := func(ctx context.Context, profile string) api.DoctorReport {
		d := &appliance.Doctor{Cfg: cfg, GPU: gpu, Units: u, Profile: profile, Telegram: sup.TelegramStatus, Exclusion: sup.Exclusion}
		if gerr != nil {
			d.GPU, d.GPUErr = nil, gerr
		}
		return d.Run(ctx)
	}
	httpAPI, err := httpapi.New(sup, doctor, log)
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// Listen before building the services: the agent and the triage worker
	// talk to the daemon's own /v1, whose port is known only now (listen
	// ":0" in tests). Connections wait in the backlog until Serve.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s (listen): %w", cfg.Listen, err)
	}
	defer ln.Close()
	// Connections beyond http.max_connections wait in the kernel's backlog
	// until one closes, so idle keep-alive floods cannot exhaust fds.
	ln = netutil.LimitListener(ln, cfg.HTTP.MaxConnections)
	selfV1 := loopbackV1(ln.Addr())
	selfClient := &http.Client{Transport: &selfAuth{base: selfV1, cfg: cfg, next: http.DefaultTransport}}
	// The front doors: each can be disabled, and one failing does not stop
	// the others or the backend (docs/architecture.md decision 6).
	px := proxy.New(sup, cfg.Proxy, func() map[string]*units.Profile { return cfg.Profiles }, log.With("component", "proxy"))
	defer px.Close()
	var m *metrics.Metrics
	if !cfg.Metrics.Disabled {
		m = metrics.New(sup, doctor, log.With("component", "metrics"))
		go m.Run(runCtx)
		m.Register(httpAPI)
		px.SetObserver(m)
		if err := m.Add(px.Collectors()...); err != nil {
			log.Error("proxy metrics not exported", "err", err)
		}
	}
	px.Register(httpAPI) // no-op when proxy.disabled
	// Benchmarks of the active profile (POST /api/bench); progress goes on
	// the event bus.
	bstore := bench.NewStore(cfg.StateDir, log.With("component", "bench"))
	bsvc := bench.NewService(bench.ServiceOptions{
		Store: bstore,
		Daemon: bench.DaemonFuncs{
			SwitchingFunc:   func() bool { return sup.State().Phase == api.PhaseSwitching },
			AwaitActiveFunc: sup.AwaitActive,
		},
		GPU:            sup.Snapshot,
		GpuhostVersion: version,
		Publish:        func(msg string) { sup.Publish(api.Event{Kind: "bench", Message: msg}) },
		Log:            log.With("component", "bench"),
	})
	defer bsvc.Close()
	bsvc.Register(httpAPI)
	// MCP over streamable HTTP at /mcp: read-only connectors, the same
	// bearer token as the API beyond loopback.
	var ms *mcp.Server
	if !cfg.MCP.Disabled {
		mlog := log.With("component", "mcp")
		extra, errs := declarative.Load(cfg.MCP.ConnectorsDir)
		for _, e := range errs {
			mlog.Error("declarative connector skipped", "err", e)
		}
		var err error
		ms, err = mcp.NewServer(mcp.ServerOptions{
			Config: cfg.MCP.Connectors, Extra: extra, Log: mlog, Version: version,
			Daemon: &wiring.MCPDaemon{Sup: sup, DoctorFn: doctor, Bench: bstore},
		})
		if err != nil {
			ms = nil
			mlog.Error("MCP server not started; the daemon carries on", "err", err)
		} else {
			for name, why := range ms.Disabled() {
				mlog.Error("MCP connector disabled", "connector", name, "reason", why)
			}
			ms.Register(httpAPI)
			go declarative.Watch(runCtx, cfg.MCP.ConnectorsDir, func() {
				extra, errs := declarative.Load(cfg.MCP.ConnectorsDir)
				for _, e := range errs {
					mlog.Error("declarative connector skipped", "err", e)
				}
				ms.ReloadExtra(extra)
			})
		}
	}
	// The agent loop: the MCP registry's read-only tools on the box's own
	// model, behind one limiter shared by the API, the panel and the bot.
	asker := newAgent(runCtx, cfg, ms, selfV1, selfClient, log.With("component", "agent"))
	agent.Register(httpAPI, asker, log.With("component", "agent"))
	if !cfg.Panel.Disabled {
		if p, err := panel.New(sup, doctor, cfg, log.With("component", "panel")); err != nil {
			log.Error("web panel not started; the daemon carries on", "err", err)
		} else {
			p.SetBench(benchPanel{bsvc, bstore})
			p.SetAsker(asker)
			p.Register(httpAPI)
		}
	}
	if cfg.Telegram.Enabled {
		if tb, err := telegram.New(cfg, sup, doctor, log.With("component", "telegram")); err != nil {
			log.Error("telegram bot not started; the daemon carries on", "err", err)
			sup.SetTelegramStatus(telegram.StoppedStatus(err, time.Now()))
		} else {
			sup.SetTelegramStatus(tb.Status)
			tb.SetAsker(asker)
			go func() {
				if err := tb.Run(runCtx); err != nil {
					log.Error("telegram bot stopped; the daemon carries on", "err", err)
				}
			}()
		}
	}
	if cfg.Triage.Enabled {
		if tw := startTriage(runCtx, cfg, sup, ms, selfV1, selfClient, log.With("component", "triage")); tw != nil {
			defer tw.Close()
			tw.Register(httpAPI)
			if m != nil {
				if err := m.Add(tw.Collectors()...); err != nil {
					log.Error("triage metrics not exported", "err", err)
				}
			}
			go func() {
				if err := runTriage(runCtx, cfg, sup, tw, log); err != nil {
					log.Error("triage worker stopped; the daemon carries on", "component", "triage", "err", err)
				}
			}()
		}
	}
	// No ReadTimeout or WriteTimeout: answers stream for minutes. Request
	// bodies get http.body_read_timeout from the front-door guard instead.
	srv := &http.Server{Handler: httpAPI, ReadHeaderTimeout: 10 * time.Second,
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
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
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
func notifySystemd(ctx context.Context, sup *appliance.Supervisor, log *slog.Logger) {
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
		return api.StatusLine(sup.State(), snapPtr)
	}
	if sent, err := daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS="+status()); err != nil {
		log.Warn("sd_notify READY failed", "err", err)
	} else if !sent {
		return // not under systemd Type=notify
	}
	interval, _ := daemon.SdWatchdogEnabled(false)
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
			_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		case <-evs:
			_, _ = daemon.SdNotify(false, "STATUS="+status())
		case <-refresh.C:
			_, _ = daemon.SdNotify(false, "STATUS="+status())
		}
	}
}

// benchPanel gives the panel's Bench page the stored runs and the service.
type benchPanel struct {
	*bench.Service
	store *bench.Store
}

func (b benchPanel) List() ([]*bench.Result, []bench.Warning, error) { return b.store.List() }
