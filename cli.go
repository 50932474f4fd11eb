package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/bench"
	"gpuhost/bench/benchcmd"
	"gpuhost/config"
	"gpuhost/internal/assemble"
	"gpuhost/nvml"
	"gpuhost/simulator"
	"gpuhost/triage/demo"
	"gpuhost/units"
)

func loadConfig(cmd *cobra.Command) (*config.Config, error) {
	path, _ := cmd.Flags().GetString("config")
	if path == "" {
		path = defaultConfigPath
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, configError{err}
	}
	return cfg, nil
}

func newServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon (systemd Type=notify service)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			return assemble.Serve(cmd.Context(), cfg, log, assemble.Options{Version: version})
		},
	}
}

func newDemoCmd() *cobra.Command {
	var listen, stateDir string
	var gpus int
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run gpuhost on the embedded default: simulated GPU and backends, no root, no systemd",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path, _ := cmd.Flags().GetString("config"); path != "" {
				// The demo is the embedded config with simulated backends; a
				// file would be silently ignored (and a typo in it never
				// reported), so it is refused instead.
				return usageError{fmt.Errorf("demo runs only its embedded config (simulated GPU and backends); --config %s is not read: run your config with `%s serve --config %s`, or check it with `%s doctor --config %s`",
					path, selfCommand(), path, selfCommand(), path)}
			}
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the gpuhost binary for the simulator: %w", err)
			}
			if stateDir == "" {
				base, err := os.UserCacheDir()
				if err != nil {
					base = os.TempDir()
				}
				stateDir = filepath.Join(base, "gpuhost-demo")
			}
			if stateDir, err = filepath.Abs(stateDir); err != nil {
				return err
			}
			cfg, err := config.Demo(self, stateDir, listen)
			if err != nil {
				return err
			}
			if err := cfg.DemoGPUs(gpus); err != nil {
				return err
			}
			for from, to := range cfg.DemoPortMoves {
				log.Warn("demo: a backend port is taken (another demo?); using a free one", "busy_port", from, "port", to)
			}
			if _, err := demo.Seed(cfg.Triage.Source.Maildir); err != nil {
				return fmt.Errorf("seed the demo mailbox: %w", err)
			}
			out := cmd.OutOrStdout()
			return assemble.Serve(cmd.Context(), cfg, log, assemble.Options{Version: version, Ready: func(addr string) {
				base := "http://" + addr
				fmt.Fprintf(out, `
gpuhost demo — %s, simulator backends, state in %s

  API status   %s/api/status
  events (SSE) %s/api/events
  profiles     %s/api/profiles
  web panel    %s/  (Ask: the agent's live tool-call timeline)
  mail triage  %s/api/triage  (sample mailbox %s; posts are printed below)

Try, in another terminal in this folder (every command finds the demo through GPUHOST_URL):
  export GPUHOST_URL=%[9]s
  %[10]s status
  %[10]s switch llama3-8b      # watch VRAM being released and re-allocated
  %[10]s switch qwen3-coder    # back: the sleeping vLLM is woken, not started
  %[10]s ask "what is the GPU status?"   # the agent loop (simulated model)
  %[10]s mcp tools             # the MCP tools this daemon serves at /mcp
  %[10]s doctor
  %[10]s client-config opencode --write   # or claude-code, codex: point a coding agent at this box
  curl -s %[9]s/api/status | python3 -m json.tool

Stop with Ctrl-C.

`, demoBox(gpus), stateDir, base, base, base, base, base, cfg.Triage.Source.Maildir, base, selfCommand())
			}})
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve the API on")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "state directory (default: user cache dir/gpuhost-demo)")
	cmd.Flags().IntVar(&gpus, "gpus", 1, "simulated GPUs (RTX 4090s without P2P); with 2 or more, llama3-8b runs on GPU 1 and gemma3-27b on GPUs 0 and 1")
	return cmd
}

// demoBox names the demo's simulated box in its banner.
func demoBox(gpus int) string {
	if gpus > 1 {
		return fmt.Sprintf("%d simulated RTX 4090s (24 GB each, no P2P)", gpus)
	}
	return "simulated RTX 4090 (24 GB)"
}

func newStatusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the active profile, GPU memory and backend units (from the daemon, else read locally)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Second)
			defer cancel()
			st, err := fetchStatus(ctx, cmd)
			if err != nil {
				return err
			}
			if asJSON {
				if err := writeJSON(cmd.OutOrStdout(), st); err != nil {
					return err
				}
			} else {
				printStatus(cmd.OutOrStdout(), st)
			}
			if st.State.NotServing != "" {
				return exitError{exitProblem} // the wanted profile does not serve
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	urlFlag(cmd)
	return cmd
}

// fetchStatus asks the daemon; when none answers at an address that was
// not named (--url, $GPUHOST_URL) and a config is readable, it reads GPU and
// units directly, so `gpuhost status` also works before the daemon runs.
func fetchStatus(ctx context.Context, cmd *cobra.Command) (api.Status, error) {
	t, err := resolveDaemon(cmd)
	if err != nil {
		return api.Status{}, err
	}
	st, err := t.client().Status(ctx)
	if err == nil || !isUnreachable(err) || t.Explicit {
		return st, err
	}
	if t.Cfg == nil {
		return st, fmt.Errorf("%w; no config for a local reading either", err)
	}
	return assemble.LocalStatus(ctx, t.Cfg), nil
}

func printStatus(w io.Writer, st api.Status) {
	if ns := st.State.NotServing; ns != "" {
		fmt.Fprintf(w, "NOT SERVING: %s; `gpuhost doctor` says why, `gpuhost heal` starts %s again\n", ns, st.State.LastWanted)
	} else if p := st.State.Paused; p != "" && st.State.LastWanted == "" {
		fmt.Fprintf(w, "paused:  %s was stopped by hand; nothing is served until `gpuhost heal`\n", p)
	}
	fmt.Fprintf(w, "state:   %s\n", api.StatusLine(st.State, st.GPU))
	for _, l := range st.State.Lanes {
		// One line per GPU set the profiles run on: each serves on its own.
		fmt.Fprintf(w, "lane %s\n", api.LaneLine(l))
	}
	if st.State.LastError != "" {
		fmt.Fprintf(w, "last error: %s\n", st.State.LastError)
	}
	if drift := appliance.WantedDrift(st.State); drift != "" && st.State.NotServing == "" {
		fmt.Fprintf(w, "wanted:  %s; `gpuhost switch %s` completes it\n", drift, st.State.LastWanted)
	}
	for _, sb := range st.State.Standby {
		fmt.Fprintf(w, "standby: %s (%s) %s, %d MiB held, since %s\n", sb.Profile, sb.Unit, sb.Mode, sb.ResidualMiB, sb.Since.Local().Format(time.TimeOnly))
	}
	if tg := st.Telegram; tg != nil {
		fmt.Fprintf(w, "telegram: %s\n", telegramLine(*tg))
	}
	if st.GPU != nil {
		printGPUs(w, st)
	} else if st.GPUError != "" {
		fmt.Fprintf(w, "gpu:     unavailable: %s\n", st.GPUError)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UNIT\tSTATE\tPID\tRESULT")
	for _, u := range st.Units {
		fmt.Fprintf(tw, "%s\t%s (%s)\t%d\t%s\n", u.Name, u.ActiveState, u.SubState, u.MainPID, u.Result)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROFILE\tBACKEND\tSERVED NAME\tPORT\tGPUS\tACTIVE")
	for _, p := range st.Profiles {
		mark := ""
		if p.Active {
			mark = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", p.Name, p.Backend, p.ServedName, p.Port, p.GPUs, mark)
	}
	tw.Flush()
}

// printGPUs writes one line per GPU: the card, its memory and load, and
// who holds memory on it (the backend unit and profile, or a foreign
// process).
func printGPUs(w io.Writer, st api.Status) {
	holders := map[int][]api.GPUHolder{}
	for _, g := range st.GPUs {
		holders[g.Index] = g.Holders
	}
	for _, d := range st.GPU.Devices {
		fmt.Fprintf(w, "gpu %d:   %s (%s) · driver %s · CUDA %s · %d/%d MiB · %d%% · %d °C · %.0f W · %.0f GB/s",
			d.Index, d.Name, api.ShortUUID(d.UUID), st.GPU.DriverVersion, st.GPU.CUDADriverVersion, d.MemoryUsedMiB, d.MemoryTotalMiB,
			d.UtilizationGPU, d.TemperatureC, d.PowerW, d.BandwidthGBs)
		hs, known := holders[d.Index]
		if !known { // an older daemon: its processes without units
			for _, p := range d.Processes {
				hs = append(hs, api.GPUHolder{PID: p.PID, Name: p.Name, UsedMiB: p.UsedMiB})
			}
		}
		var parts []string
		for _, h := range hs {
			who := fmt.Sprintf("pid %d %s", h.PID, h.Name)
			switch {
			case h.Profile != "":
				who = fmt.Sprintf("%s (%s, pid %d)", h.Profile, h.Unit, h.PID)
			case h.Unit != "":
				who = fmt.Sprintf("%s (pid %d)", h.Unit, h.PID)
			}
			parts = append(parts, fmt.Sprintf("%s %d MiB", who, h.UsedMiB))
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, " · %s", strings.Join(parts, ", "))
		}
		fmt.Fprintln(w)
	}
}

// telegramLine is the bot's health in one line: state, why, the bot, and
// the counters an operator acts on (never the token).
func telegramLine(tg api.TelegramStatus) string {
	parts := []string{tg.State}
	if tg.Bot != "" {
		parts[0] += " as @" + tg.Bot
	}
	if tg.Reason != "" {
		parts = append(parts, tg.Reason)
	}
	if !tg.LastPoll.IsZero() {
		parts = append(parts, "last poll "+tg.LastPoll.Local().Format(time.TimeOnly))
	}
	var errs uint64
	for _, n := range tg.Errors {
		errs += n
	}
	if errs > 0 {
		parts = append(parts, fmt.Sprintf("%d failed Bot API calls", errs))
	}
	if tg.UpdatesSkipped > 0 {
		parts = append(parts, fmt.Sprintf("%d updates skipped", tg.UpdatesSkipped))
	}
	if tg.NotificationsDropped > 0 {
		parts = append(parts, fmt.Sprintf("%d notifications dropped", tg.NotificationsDropped))
	}
	return strings.Join(parts, " · ")
}

func newSwitchCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "switch PROFILE",
		Short: "Switch the GPU to a profile and follow each step live",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			err = c.SwitchAndFollow(cmd.Context(), api.SwitchRequest{Profile: args[0], Force: force}, func(e api.Event) {
				fmt.Fprintln(out, api.FormatEvent(e))
			})
			var det *api.SwitchDetachedError
			if errors.As(err, &det) {
				// Ctrl-C stops following, not the switch: the daemon owns it.
				fmt.Fprintf(cmd.ErrOrStderr(), "\nstopped following; the switch to %s goes on in the daemon (switch %s).\n"+
					"Follow it with:  %s status --url %s   (or: curl -N '%s%s')\n", args[0], det.SwitchID, selfCommand(), c.BaseURL, c.BaseURL, det.Events)
				return exitError{130}
			}
			return err // an unknown profile is the daemon's 404: a usage error (64)
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "switch even if the profile fails doctor checks")
	urlFlag(cmd)
	return cmd
}

func newHealCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "heal",
		Short: "Start the wanted profile again (after a crash loop, a failed switch or a hand stop) and follow it",
		Long: `Starts the last wanted profile again through a switch, or the profile whose
backend was stopped by hand, and forgets the crash count that made the
daemon stop restarting it. Exit 0 when it serves again, 1 when the switch
failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			// Nothing to heal is the daemon's 409: a problem found (exit 1).
			return c.HealAndFollow(cmd.Context(), func(e api.Event) { fmt.Fprintln(out, api.FormatEvent(e)) })
		},
	}
	urlFlag(cmd)
	return cmd
}

func newDoctorCmd() *cobra.Command {
	var asJSON bool
	var profile string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check driver, settings, units and endpoint; exit 0 ok (warnings printed), 1 a check failed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			var rep api.DoctorReport
			t, err := resolveDaemon(cmd)
			if err != nil {
				return err
			}
			rep, err = t.client().Doctor(ctx, profile)
			switch {
			case err == nil:
			case !isUnreachable(err) || t.Explicit:
				return err
			case t.Cfg == nil:
				return fmt.Errorf("%w; no config for a local check either", err)
			default:
				// No daemon: check this box locally from its config.
				cfg := t.Cfg
				if profile != "" {
					if _, ok := cfg.Profiles[profile]; !ok {
						return usageError{fmt.Errorf("--profile %q: no such profile (profiles: %s)", profile, strings.Join(cfg.ProfileNames(), ", "))}
					}
				}
				rep = assemble.LocalDoctor(ctx, cfg, profile)
			}
			if asJSON {
				if err := writeJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				printDoctor(cmd.OutOrStdout(), rep)
			}
			return doctorExit(rep.Exit)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&profile, "profile", "", "check only this profile")
	cmd.Flags().String("url", "", "daemon API base URL (default: $"+envDaemonURL+", else the config's listen, else "+DefaultDaemonURL+"; no daemon there: checked locally from the config)")
	return cmd
}

// doctorIDWidth caps the id column of printDoctor: a longer id (a long
// profile name) gets its message on the next line instead of pushing
// every other row's message to the right.
const doctorIDWidth = 48

func printDoctor(w io.Writer, rep api.DoctorReport) {
	checkID := func(c api.DoctorCheck) string {
		if c.Profile != "" {
			return c.ID + "[" + c.Profile + "]"
		}
		return c.ID
	}
	width := 0
	for _, c := range rep.Checks {
		if n := utf8.RuneCountInString(checkID(c)); n <= doctorIDWidth {
			width = max(width, n)
		}
	}
	for _, c := range rep.Checks {
		mark := map[units.Severity]string{units.SeverityOK: "ok  ", units.SeverityWarn: "WARN", units.SeverityFail: "FAIL"}[c.Severity]
		id := checkID(c)
		if utf8.RuneCountInString(id) > width {
			fmt.Fprintf(w, "%s %s\n%s %s\n", mark, id, strings.Repeat(" ", 5+width), c.Message)
		} else {
			fmt.Fprintf(w, "%s %-*s %s\n", mark, width, id, c.Message)
		}
		if c.Fix != "" && c.Severity != units.SeverityOK {
			fmt.Fprintf(w, "     fix: %s\n", c.Fix)
		}
	}
	fmt.Fprintf(w, "worst: %s\n", rep.Worst)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newSimulateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "simulate vllm|ollama [serve] [MODEL] [flags]",
		Short: "Run an inference-server simulator that speaks the vLLM or Ollama HTTP API",
		Long: `Simulates vLLM or Ollama for the demo and the tests: the same HTTP API, paced
prefill and decode, and simulated GPU memory claimed while loaded.

Simulator flags: --port, --host, --model (repeatable for ollama), --served-name,
--load-time, --prefill-tps, --decode-tps, --vram-mib, --sim-dir,
--scripted-tools (call offered tools as the question names them, retry a
failed call once, answer from the results, labelled "[simulated model]"),
--stop-delay (keep serving that long after SIGTERM, a slow stop),
--schema-fault prose|invalid|prose-once (structured output misbehaves),
--tool-call-fault content|xml|bad-arguments (tool calls come back as text in
content, or with arguments that are not JSON) and
--transcription-fault error (/v1/audio/transcriptions answers 500), and
--wake-fault hang|output|slow|residual (vllm: a woken engine hangs, answers
other words or decodes at half speed; or each sleep after the first keeps
4 GiB above the residual),
--crash-file PATH (exit with status 3 at start while PATH exists) and
--crash-after-requests N (exit with status 3 after answering N inference
requests), for tests.
--network auto|fenced|open: where the network is fenced (auto: run by systemd
with nothing but loopback, as under the rendered units' PrivateNetwork=yes)
it refuses to start unless the offline settings are set (vllm:
HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, VLLM_NO_USAGE_STATS, DO_NOT_TRACK;
ollama: OLLAMA_NO_CLOUD, DO_NOT_TRACK), as a real vLLM would fail there.
For vllm every vLLM serve flag is accepted too (--gpu-memory-utilization,
--max-num-seqs, --served-model-name, …), so a profile's argv runs unchanged.
For ollama the address also comes from OLLAMA_HOST.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
				return cmd.Help()
			}
			opts, err := simulator.ParseArgs(args[0], args[1:], os.Getenv)
			if errors.Is(err, simulator.ErrNotOffline) {
				return configError{err} // the unit's environment, not the command line
			}
			if err != nil {
				return usageError{err}
			}
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			opts.Logger = log // simulator.Run adds sim=<flavor>
			return simulator.Run(cmd.Context(), opts)
		},
	}
}

// benchEnv gives `gpuhost bench` the config-derived facts: where results
// live, the profiles, the GPU, and the daemon's managed /v1 as the default
// target.
func benchEnv(cmd *cobra.Command) (benchcmd.Env, error) {
	cfg, err := loadConfig(cmd)
	if err != nil && configMissing(cmd, err) {
		return daemonBenchEnv(cmd), nil
	}
	if err != nil {
		return benchcmd.Env{}, err
	}
	env := benchcmd.Env{StateDir: cfg.StateDir, Profiles: cfg.Profiles}
	env.GPU = func(ctx context.Context) (nvml.Snapshot, error) { return assemble.LocalSnapshot(ctx, cfg) }
	env.Active = func(ctx context.Context) (bench.Target, *units.Profile, error) {
		c, err := apiClient(cmd)
		if err != nil {
			return bench.Target{}, nil, err
		}
		st, err := c.Status(ctx)
		if err != nil {
			return bench.Target{}, nil, err
		}
		p, ok := cfg.Profiles[st.State.Profile]
		if st.State.Phase != api.PhaseActive || !ok {
			return bench.Target{}, nil, fmt.Errorf("no active profile on the daemon at %s (state %s)", c.BaseURL, st.State.Phase)
		}
		t := bench.ProfileTarget(p, c.BaseURL+"/v1")
		t.APIKey = c.Token
		return t, p, nil
	}
	return env, nil
}
