package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/internal/exitclass"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/spf13/cobra"
)

// Setup is what the CLI's loader hands `gpuhost mcp`: the server's one
// constructor (the daemon's assembly, with the config's connectors, the
// declarative ones and the view of the box that gpu and inference read)
// and what to release after.
type Setup struct {
	// Build constructs the server, logging to log (required).
	Build func(log *slog.Logger) (*Server, error)
	// Close releases what Load opened (GPU handle, demo simulators); nil
	// when there is nothing to release.
	Close func()
}

// CmdDeps is how package main wires `gpuhost mcp` without this package
// importing the daemon's config loading:
//
//	mcp.NewCmd(mcp.CmdDeps{
//		Load:        mcpSetup,          // loadConfig(cmd) → the assembly's server constructor and its Close
//		Demo:        mcpDemoSetup,      // the same over the demo config, Close stops its Supervisor
//		Logger:      newLogger,         // must write to stderr (stdout is the protocol)
//		Exit:        func(code int) error { return exitError{code} },
//		Version:     version,
//	})
type CmdDeps struct {
	// Load reads the config named by the command's flags (required).
	Load func(cmd *cobra.Command) (Setup, error)
	// Demo returns the demo configuration for --demo (nil: no --demo).
	Demo func(cmd *cobra.Command) (Setup, error)
	// DemoTools is Demo for `mcp tools --demo`, which only lists tools:
	// the demo's connectors without starting its simulated backends (nil:
	// Demo is used).
	DemoTools func(cmd *cobra.Command) (Setup, error)
	// Logger returns the logger; it must write to stderr. Default: text
	// on stderr at info.
	Logger func(cmd *cobra.Command) (*slog.Logger, error)
	// Exit turns an exit status into the error main understands (default:
	// a plain error, which main reports as a failure).
	Exit func(code int) error
	// Version is reported to MCP clients.
	Version string
	// Remote names the running daemon `gpuhost mcp tools` lists (without
	// --demo): its tools over MountPath, no second supervisor. nil: the
	// tools are built locally from Load.
	Remote func(cmd *cobra.Command) (Remote, error)
}

// NewCmd returns `gpuhost mcp` with its subcommands tools and test.
func NewCmd(deps CmdDeps) *cobra.Command {
	st := &cmdSetup{deps: deps}
	cmd := newServeCmd(st)
	cmd.PersistentFlags().BoolVar(&st.demo, "demo", false, "use the demo configuration (simulated GPU and backends, calc, weather)")
	cmd.AddCommand(newToolsCmd(st), newTestCmd(st))
	return cmd
}

// cmdSetup builds the server every `gpuhost mcp` command works on, from
// deps and the persistent --demo flag.
type cmdSetup struct {
	deps CmdDeps
	demo bool
	// listing: the command only lists tools (DemoTools serves --demo).
	listing bool
}

// server loads the configuration (the demo's with --demo), the declarative
// connectors, and builds the server; the func returned with it releases
// what loading opened.
func (st *cmdSetup) server(cmd *cobra.Command, level slog.Level) (*Server, func(), *slog.Logger, error) {
	deps := st.deps
	log, err := cmdLogger(cmd, deps, level)
	if err != nil {
		return nil, nil, nil, err
	}
	load := deps.Load
	if st.demo {
		if deps.Demo == nil {
			return nil, nil, nil, errors.New("--demo is not available in this build")
		}
		load = deps.Demo
		if st.listing {
			load = deps.DemoTools
		}
	}
	if load == nil {
		return nil, nil, nil, errors.New("mcp: no config loader wired")
	}
	su, err := load(cmd)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load mcp config: %w", err)
	}
	closeFn := func() {
		if su.Close != nil {
			su.Close()
		}
	}
	if su.Build == nil {
		closeFn()
		return nil, nil, nil, errors.New("mcp: the loader wired no server constructor")
	}
	s, err := su.Build(log)
	if err != nil {
		closeFn()
		return nil, nil, nil, err
	}
	return s, closeFn, log, nil
}

// newServeCmd is `gpuhost mcp` itself: the tools over stdio.
func newServeCmd(st *cmdSetup) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve the read-only MCP tools over stdio (for Claude Code, opencode)",
		Long: "Serves the tools of every connector configured under mcp.connectors over stdio.\n" +
			"Protocol on stdout, logs on stderr. --demo serves the demo configuration\n" +
			"(simulated GPU and backends, calc, weather) without a config file.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, closeFn, log, err := st.server(cmd, slog.LevelInfo)
			if err != nil {
				return err
			}
			defer closeFn()
			for name, why := range s.Disabled() {
				log.Warn("mcp connector disabled", "connector", name, "reason", why)
			}
			return s.ServeStdio(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
}

// newToolsCmd is `gpuhost mcp tools`: the running daemon's tools (deps.Remote),
// or with --demo (or no Remote) the locally built server's.
func newToolsCmd(st *cmdSetup) *cobra.Command {
	deps := st.deps
	var asJSON bool
	tools := &cobra.Command{
		Use:   "tools",
		Short: "List the tools of the enabled connectors with their input schemas",
		Args:  cobra.NoArgs,
		Long: "Lists the tools the running daemon serves at " + MountPath + " (found like every command:\n" +
			"--url, $GPUHOST_URL, the config's listen, http://127.0.0.1:8080). --demo lists the\n" +
			"demo configuration's tools without a daemon.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !st.demo && deps.Remote != nil {
				r, err := deps.Remote(cmd)
				if err != nil {
					return err
				}
				ts, err := ListRemoteTools(cmd.Context(), r, deps.Version)
				if err != nil {
					return err
				}
				return printRemoteTools(cmd.OutOrStdout(), ts, asJSON)
			}
			if st.demo && deps.DemoTools != nil {
				st.listing = true
			}
			s, closeFn, _, err := st.server(cmd, slog.LevelWarn)
			if err != nil {
				return err
			}
			defer closeFn()
			return printTools(cmd.OutOrStdout(), s, asJSON)
		},
	}
	tools.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	if deps.Remote != nil {
		tools.Flags().String("url", "", "daemon API base URL (default: $GPUHOST_URL, else the config's listen, else http://127.0.0.1:8080)")
	}
	return tools
}

// newTestCmd is `gpuhost mcp test [connector]`: RunChecks, exit 1 (deps.Exit)
// when any check fails.
func newTestCmd(st *cmdSetup) *cobra.Command {
	deps := st.deps
	return &cobra.Command{
		Use:   "test [connector]",
		Short: "Call every configured target of each enabled connector once; exit 1 if any fails",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, closeFn, _, err := st.server(cmd, slog.LevelWarn)
			if err != nil {
				return err
			}
			defer closeFn()
			only := ""
			if len(args) == 1 {
				only = args[0]
			}
			failed, err := RunChecks(cmd.Context(), s, only, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			if failed > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d check(s) failed\n", failed)
				if deps.Exit != nil {
					return deps.Exit(1)
				}
				return fmt.Errorf("%d check(s) failed", failed)
			}
			return nil
		},
	}
}

func cmdLogger(cmd *cobra.Command, deps CmdDeps, level slog.Level) (*slog.Logger, error) {
	if deps.Logger != nil {
		return deps.Logger(cmd)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), nil
}

func printTools(w io.Writer, s *Server, asJSON bool) error {
	tools, disabled := s.Tools(), s.Disabled()
	if asJSON {
		defs := make([]mcpgo.Tool, 0, len(tools))
		for _, t := range tools {
			defs = append(defs, t.Tool.Def)
		}
		out := struct {
			Tools    []mcpgo.Tool      `json:"tools"`
			Disabled map[string]string `json:"disabled"`
		}{defs, disabled}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	for _, t := range tools {
		desc, _, _ := strings.Cut(t.Tool.Def.Description, "\n")
		schema, err := inputSchema(t.Tool.Def)
		if err != nil {
			return fmt.Errorf("tool %s: %w", t.Tool.Def.Name, err)
		}
		b, _ := json.Marshal(schema)
		fmt.Fprintf(w, "%s\n  %s\n  schema: %s\n", t.Tool.Def.Name, desc, b)
	}
	names := make([]string, 0, len(disabled))
	for n := range disabled {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "disabled connector %s: %s\n", n, disabled[n])
	}
	if len(tools) == 0 && len(names) == 0 {
		fmt.Fprintln(w, "no connectors configured (add sections under mcp.connectors)")
	}
	return nil
}

// RunChecks is `gpuhost mcp test`: for each enabled connector (or only
// the named one) it calls every tool with Targets once per target through
// the in-process client, so the check goes through the same validation,
// timeout and scrubbing as a model's call. It prints one line per target
// and returns how many failed; a configured connector that is disabled
// counts as a failure.
func RunChecks(ctx context.Context, s *Server, only string, w io.Writer) (int, error) {
	disabled, enabled := s.Disabled(), s.Enabled()
	if only != "" {
		_, on := disabled[only]
		if !on && !contains(enabled, only) {
			// An unknown connector name is the caller's usage error (64).
			return 0, exitclass.UsageErr(fmt.Errorf("connector %q is not configured (enabled: %s)", only, strings.Join(enabled, ", ")))
		}
	}
	failed := 0
	names := make([]string, 0, len(disabled))
	for n := range disabled {
		if only == "" || only == n {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "FAIL connector %s disabled: %s\n", n, disabled[n])
		failed++
	}
	c, err := s.InProcessClient(ctx)
	if err != nil {
		return failed, err
	}
	defer c.Close()
	checks := 0
	for _, ti := range s.Tools() {
		tg := ti.Tool.Targets
		if tg == nil || (only != "" && ti.Connector != only) {
			continue
		}
		vals := append([]string(nil), tg.Values...)
		sort.Strings(vals)
		for _, v := range vals {
			checks++
			args := map[string]any{}
			if tg.TestArgs != nil {
				for k, x := range tg.TestArgs(v) {
					args[k] = x
				}
			}
			args[tg.Param] = v
			req := mcpgo.CallToolRequest{}
			req.Params.Name = ti.Tool.Def.Name
			req.Params.Arguments = args
			t0 := time.Now()
			res, err := c.CallTool(ctx, req)
			ms := time.Since(t0).Milliseconds()
			label := fmt.Sprintf("%s %s=%s", ti.Tool.Def.Name, tg.Param, v)
			switch {
			case err != nil:
				failed++
				fmt.Fprintf(w, "FAIL %s: %s\n", label, s.Scrub(err.Error()))
			case res.IsError:
				failed++
				fmt.Fprintf(w, "FAIL %s: %s\n", label, oneLine(resultText(res)))
			default:
				fmt.Fprintf(w, "ok   %s %d ms\n", label, ms)
			}
		}
	}
	if checks == 0 && len(names) == 0 {
		fmt.Fprintln(w, "no targets to check (no enabled connector has tools with configured targets)")
	}
	return failed, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// resultText joins a result's text contents.
func resultText(res *mcpgo.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := mcpgo.AsTextContent(c); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
