package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/atomicfile"
	"gpuhost/internal/loopback"
)

func newOpencodeConfigCmd() *cobra.Command {
	var baseURL string
	var write bool
	var minContext int
	cmd := &cobra.Command{
		Use:   "opencode-config [--write [PATH]]",
		Short: "Print (or merge into opencode.json) a provider block for the box's /v1 endpoint",
		Long: `Asks the running daemon (/v1/models, /api/profiles) which models it serves and
prints an opencode.json whose provider "gpuhost" points at its /v1 endpoint, with
each model's context and output limits and tool calls.

Only models opencode can use are listed: it sends tools with every prompt, so a
vLLM profile without enable_auto_tool_choice and tool_call_parser is left out, and
so is a model whose context is below --min-context (opencode's own prompt and tool
schemas take about 8.2k tokens). Each one left out is named on stderr with the fix.

--write merges the provider into PATH (default: ~/.config/opencode/opencode.json):
other providers and keys are kept, the old file is kept as PATH.bak.<UTC time>
(earlier backups are never overwritten), the new one replaces it atomically with
the old one's mode and owner; a symbolic link is refused (give its target as PATH);
nothing is written when the daemon cannot be asked. Model names a client would
expand ({…}, $) are left out.
Beyond loopback the API key is referenced as {env:VAR}, never written into the file.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runOpencodeConfig(cmd, args, baseURL, write, minContext)
		},
	}
	urlFlag(cmd)
	cmd.Flags().StringVar(&baseURL, "base-url", "", "URL opencode reaches the box at, written into the file (default: the daemon URL used)")
	cmd.Flags().BoolVar(&write, "write", false, "merge into PATH (default ~/.config/opencode/opencode.json) instead of printing")
	cmd.Flags().IntVar(&minContext, "min-context", proxy.OpencodeMinContext, "leave out models whose context (tokens) is below this")
	return cmd
}

// runOpencodeConfig is opencode-config (and client-config opencode).
func runOpencodeConfig(cmd *cobra.Command, args []string, baseURL string, write bool, minContext int) error {
	if len(args) == 1 && !write {
		return usageError{fmt.Errorf("opencode-config: PATH %q is only taken with --write", args[0])}
	}
	t, err := resolveDaemon(cmd)
	if err != nil {
		return err
	}
	c := t.client()
	ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Second)
	defer cancel()
	var list proxy.ModelList
	if err := c.Get(ctx, "/v1/models", &list); err != nil {
		return fmt.Errorf("opencode-config: ask the daemon for its models: %w", err)
	}
	profiles, err := c.Profiles(ctx)
	if err != nil {
		return fmt.Errorf("opencode-config: ask the daemon for its profiles: %w", err)
	}
	models := proxy.OpencodeModels(list, profiles)
	public := baseURL
	if public == "" {
		public = c.BaseURL
	}
	env := ""
	if !loopbackURL(public) {
		env = "GPUHOST_API_TOKEN"
		if t.Cfg != nil {
			env = t.Cfg.APITokenEnv
		}
	}
	stderr := cmd.ErrOrStderr()
	note := func(skipped []proxy.OpencodeSkipped) {
		for _, s := range skipped {
			fmt.Fprintf(stderr, "note: %s\n", s)
		}
	}
	if !write {
		out, skipped, err := proxy.OpencodeConfig(public, models, env, minContext)
		note(skipped)
		if err != nil {
			return err
		}
		if _, err = cmd.OutOrStdout().Write(out); err != nil {
			return err
		}
		printedOnly(cmd, defaultOpencodePath)
		return nil
	}
	path := ""
	if len(args) == 1 {
		path = args[0]
	} else if path, err = defaultOpencodePath(); err != nil {
		return err
	}
	return writeOpencodeConfig(cmd, path, func(existing []byte) ([]byte, error) {
		out, skipped, err := proxy.MergeOpencodeConfig(existing, public, models, env, minContext)
		note(skipped)
		return out, err
	})
}

// printedOnly tells, on stderr, that the printed config went nowhere and
// where --write would merge it: a user who ran the command without --write
// otherwise cannot tell whether a file was changed.
func printedOnly(cmd *cobra.Command, defaultPath func() (string, error)) {
	where := "the client's config file"
	if p, err := defaultPath(); err == nil {
		where = p
	}
	label := cmd.CommandPath()
	if cmd.Name() == "client-config" && cmd.Flags().NArg() > 0 {
		label += " " + cmd.Flags().Arg(0)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "note: printed only, nothing was written; %s --write merges it into %s (or give PATH), keeping a backup of the file\n",
		label, where)
}

// defaultOpencodePath is opencode's global config file.
func defaultOpencodePath() (string, error) {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("opencode-config --write: find the home directory (or give PATH): %w", err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "opencode", "opencode.json"), nil
}

// writeOpencodeConfig merges the opencode provider into path (writeMerged).
func writeOpencodeConfig(cmd *cobra.Command, path string, merge func([]byte) ([]byte, error)) error {
	return writeMerged(cmd, "opencode-config", path, fmt.Sprintf("provider %q", proxy.OpencodeProviderID), merge)
}

// writeMerged merges into path for command name: the existing content
// (none when the file is not there) goes through merge; a changed result
// replaces the file atomically, with its mode and owner (a new file gets
// its folder's owner), after the old
// content is saved as a new timestamped backup (PATH.bak.20261206T023600Z),
// so no run ever overwrites an earlier backup, the user's first one
// included. A symlinked path is refused: the link could point at any file
// of the user's, and the merge would rewrite it and put a backup beside
// it; give the link's target as PATH to write there. what names what was
// written, for the message.
func writeMerged(cmd *cobra.Command, name, path, what string, merge func([]byte) ([]byte, error)) error {
	perm := fs.FileMode(0o644)
	var owner *atomicfile.Owner
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		target, _ := filepath.EvalSymlinks(path)
		return usageError{fmt.Errorf("%s --write: %s is a symbolic link (to %s); nothing was written: give the file it points to as PATH if that is the file to change", name, path, target)}
	case err == nil && !fi.Mode().IsRegular():
		return usageError{fmt.Errorf("%s --write: %s is not a regular file; nothing was written", name, path)}
	case err == nil:
		perm = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			owner = &atomicfile.Owner{UID: int(st.Uid), GID: int(st.Gid)}
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s --write: %w", name, err)
	default:
		// A new file belongs to whoever owns its folder (root writing
		// into a user's ~/.config leaves a file the user can edit).
		if di, err := os.Stat(filepath.Dir(path)); err == nil {
			if st, ok := di.Sys().(*syscall.Stat_t); ok {
				owner = &atomicfile.Owner{UID: int(st.Uid), GID: int(st.Gid)}
			}
		}
	}
	existing, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		existing = nil
	case err != nil:
		return fmt.Errorf("%s --write: read %s: %w", name, path, err)
	}
	out, err := merge(existing)
	if err != nil {
		return fmt.Errorf("%s --write %s (left as it was): %w", name, path, err)
	}
	w := cmd.OutOrStdout()
	if bytes.Equal(out, existing) {
		fmt.Fprintf(w, "%s is up to date\n", path)
		return nil
	}
	opts := atomicfile.Options{Owner: owner}
	if existing == nil {
		if err := atomicfile.WriteWith(path, out, perm, opts); err != nil {
			return fmt.Errorf("%s --write: %w", name, err)
		}
		fmt.Fprintf(w, "wrote %s\n", path)
		return nil
	}
	bak, err := writeBackup(path, existing, perm, owner, time.Now())
	if err != nil {
		return fmt.Errorf("%s --write: back up %s (left as it was): %w", name, path, err)
	}
	if err := atomicfile.WriteWith(path, out, perm, opts); err != nil {
		return fmt.Errorf("%s --write: %w", name, err)
	}
	fmt.Fprintf(w, "wrote %s into %s (previous file: %s)\n", what, path, bak)
	return nil
}

// writeBackup saves data as path.bak.<UTC time>, never replacing a file
// already there (a second run within the same second gets -2, -3, …).
func writeBackup(path string, data []byte, perm fs.FileMode, owner *atomicfile.Owner, now time.Time) (string, error) {
	base := path + ".bak." + now.UTC().Format("20060102T150405Z")
	for i := 1; i <= 100; i++ {
		bak := base
		if i > 1 {
			bak = fmt.Sprintf("%s-%d", base, i)
		}
		err := atomicfile.WriteWith(bak, data, perm, atomicfile.Options{Owner: owner, NoReplace: true})
		if err == nil {
			return bak, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("%s and 99 more backups of this second exist", base)
}

// loopbackURL: the URL's host is localhost or a loopback address
// (loopback.DialsLoopback).
func loopbackURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	return loopback.DialsLoopback(u.Hostname())
}
