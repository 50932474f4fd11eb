package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/config"
	"gpuhost/internal/atomicfile"
	"gpuhost/systemd"
	"gpuhost/units"
)

// unitFile is one file gpuhost renders for systemd, relative to the unit dir.
type unitFile struct {
	Path    string
	Content string
}

// renderUnits returns gpuhost.service plus, per backend, either our own
// unit file or, for an adopted unit, the drop-in that adds Conflicts=. It
// validates every unit first (the config loader did too; this also covers
// --binary and --config, which only reach the unit here) and renders
// nothing when one is refused.
func renderUnits(cfg *config.Config, binary, configPath string, adopt bool) ([]unitFile, error) {
	// ExecStart= needs an absolute path; a relative --config is meant from here.
	if abs, err := filepath.Abs(configPath); err == nil {
		configPath = abs
	}
	du := cfg.DaemonUnit(binary, configPath)
	var errs []error
	if err := du.Validate(); err != nil {
		errs = append(errs, err)
	}
	bus := cfg.BackendUnits()
	for i := range bus {
		if adopt {
			bus[i].Adopt = true
		}
		if err := bus[i].Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	// --adopt leaves the operator's units (and their network) alone: no
	// proxy sockets for gpuhost.service to want then.
	du.Sockets = nil
	for _, bu := range bus {
		du.Sockets = append(du.Sockets, bu.ProxySocketUnits()...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("render units from %s: %w", configPath, err)
	}
	files := []unitFile{{Path: "gpuhost.service", Content: units.RenderDaemonUnit(du)}}
	for _, bu := range bus {
		if bu.Adopt {
			p, c := units.RenderAdoptDropIn(bu)
			files = append(files, unitFile{Path: p, Content: c})
			continue
		}
		files = append(files, unitFile{Path: bu.Name, Content: units.RenderBackendUnit(bu)})
		for _, f := range units.RenderProxyUnits(bu) {
			files = append(files, unitFile{Path: f.Name, Content: f.Content})
		}
	}
	return files, nil
}

func newUnitsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "units", Short: "Render or install gpuhost's systemd units"}
	var dir, binary string
	var adopt, example bool
	render := &cobra.Command{
		Use:   "render",
		Short: "Print the unit files (or write them into --dir)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, path, err := configForUnits(cmd, example)
			if err != nil {
				return err
			}
			files, err := renderUnits(cfg, binary, path, adopt)
			if err != nil {
				return err
			}
			if dir == "" {
				for _, f := range files {
					fmt.Fprintf(cmd.OutOrStdout(), "# ===== %s =====\n%s\n", f.Path, f.Content)
				}
				return nil
			}
			return writeUnitFiles(dir, files)
		},
	}
	render.Flags().StringVar(&dir, "dir", "", "write the files into this directory instead of printing them")
	render.Flags().BoolVar(&example, "example", false, "render the embedded example config as if installed at --config (default "+config.DefaultPath+"), ignoring any file there (what the Debian package ships)")
	install := &cobra.Command{
		Use:   "install",
		Short: "Install config (if none), units or drop-ins, daemon-reload, enable --now gpuhost",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, _ := cmd.Flags().GetString("config")
			if path == "" {
				path = config.DefaultPath
			}
			if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
				if err := atomicfile.Write(path, config.Example, 0o640); err != nil {
					return fmt.Errorf("install example config: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "installed example config %s (edit the profiles, then `systemctl restart gpuhost`)\n", path)
			}
			cfg, err := config.Load(path)
			if err != nil {
				return configError{err}
			}
			files, err := renderUnits(cfg, binary, path, adopt)
			if err != nil {
				return err
			}
			if err := writeUnitFiles(cfg.Systemd.UnitDir, files); err != nil {
				return err
			}
			for _, f := range files {
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", filepath.Join(cfg.Systemd.UnitDir, f.Path))
			}
			noStart, _ := cmd.Flags().GetBool("no-start")
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			m, err := systemd.Connect(ctx, cfg.Systemd.Socket)
			if err != nil {
				return err
			}
			defer m.Close()
			if err := m.Reload(ctx); err != nil {
				return err
			}
			if err := m.EnableUnitFiles(ctx, []string{"gpuhost.service"}, false); err != nil {
				return err
			}
			if noStart {
				fmt.Fprintln(cmd.OutOrStdout(), "enabled gpuhost.service")
				return nil
			}
			if err := m.Start(ctx, "gpuhost.service"); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "enabled and started gpuhost.service; follow it with `journalctl -fu gpuhost`")
			return nil
		},
	}
	install.Flags().Bool("no-start", false, "enable but do not start gpuhost.service")
	for _, c := range []*cobra.Command{render, install} {
		c.Flags().BoolVar(&adopt, "adopt", false, "adopt the existing backend units: only add a Conflicts= drop-in")
		c.Flags().StringVar(&binary, "binary", "/usr/local/bin/gpuhost", "path of the installed gpuhost binary")
	}
	cmd.AddCommand(render, install)
	return cmd
}

// configForUnits loads --config, or the example config when none exists
// yet (rendering should work before installing) or when example is set
// (then --config only names where the config will be installed).
func configForUnits(cmd *cobra.Command, example bool) (*config.Config, string, error) {
	path, _ := cmd.Flags().GetString("config")
	if example {
		if path == "" {
			path = config.DefaultPath
		}
		cfg, err := config.Parse("example config", config.Example)
		return cfg, path, err
	}
	if path == "" {
		path = config.DefaultPath
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			// Say so: the units shown are the example's, not this box's.
			fmt.Fprintf(cmd.ErrOrStderr(), "gpuhost: no config at %s: rendering the embedded example config "+
				"(config/gpuhost.example.yaml; --config FILE renders yours, --example says this on purpose)\n", path)
			cfg, err := config.Parse("example config", config.Example)
			return cfg, path, err
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, path, configError{err}
	}
	return cfg, path, nil
}

func writeUnitFiles(dir string, files []unitFile) error {
	for _, f := range files {
		if err := atomicfile.Write(filepath.Join(dir, f.Path), []byte(f.Content), 0o644); err != nil {
			return fmt.Errorf("install unit: %w", err)
		}
	}
	return nil
}
