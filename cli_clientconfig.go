package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/spf13/cobra"

	"gpuhost/frontdoor/proxy"
)

func newClientConfigCmd() *cobra.Command {
	var baseURL string
	var write bool
	var minContext int
	cmd := &cobra.Command{
		Use:   "client-config claude-code|codex|opencode [--write [PATH]]",
		Short: "Print (or merge into the client's own config) the settings that point a coding agent at the box",
		Long: `Asks the running daemon which models it serves and prints the settings that
point a coding agent at its /v1 endpoint; --write merges them into the client's
own file instead (other keys are kept, the old file is kept as PATH.bak.<UTC time>
and earlier backups are never overwritten, the new one replaces it atomically with
the old one's mode and owner, a symbolic link is refused: give its target as PATH;
nothing is written when the daemon cannot be asked). Model names that a client
would expand ({…}, $, control characters) are left out, each named on stderr.
Models without working tool calls are left out (every one of these clients sends
tools), each named on stderr with the fix.

  claude-code  Anthropic Messages. The "env" block of Claude Code's settings
               (default ~/.claude/settings.json): ANTHROPIC_BASE_URL, ANTHROPIC_MODEL
               and its small/fast model (the same model: a second one would switch
               the GPU every turn). On loopback a placeholder ANTHROPIC_AUTH_TOKEN is
               set; beyond it no token is written: export ANTHROPIC_AUTH_TOKEN in the
               shell. A token already in the file is kept.
  codex        OpenAI Responses. A [model_providers.gpuhost] table with
               wire_api = "responses" in ~/.codex/config.toml (or $CODEX_HOME), selected
               as model_provider with the model; beyond loopback it names the
               variable holding the token (env_key). Comments are not kept (see the backup).
  opencode     Chat Completions: the same as opencode-config.`,
		Args:      cobra.RangeArgs(1, 2),
		ValidArgs: []string{"claude-code", "codex", "opencode"},
		RunE: func(cmd *cobra.Command, args []string) error {
			client := args[0]
			if len(args) == 2 && !write {
				return usageError{fmt.Errorf("client-config: PATH %q is only taken with --write", args[1])}
			}
			switch client {
			case "opencode":
				return runOpencodeConfig(cmd, args[1:], baseURL, write, minContext)
			case "claude-code", "codex":
			default:
				return usageError{fmt.Errorf("client-config: unknown client %q (claude-code, codex or opencode)", client)}
			}
			return runAgentClientConfig(cmd, client, args[1:], baseURL, write)
		},
	}
	urlFlag(cmd)
	cmd.Flags().StringVar(&baseURL, "base-url", "", "URL the client reaches the box at, written into the file (default: the daemon URL used)")
	cmd.Flags().BoolVar(&write, "write", false, "merge into PATH (default: the client's own config file) instead of printing")
	cmd.Flags().IntVar(&minContext, "min-context", proxy.OpencodeMinContext, "opencode: leave out models whose context (tokens) is below this")
	return cmd
}

// daemonModels asks the daemon for its models and the URL clients use.
func daemonModels(cmd *cobra.Command, name, baseURL string) (models []proxy.OpencodeModelInfo, public, tokenEnv string, err error) {
	t, err := resolveDaemon(cmd)
	if err != nil {
		return nil, "", "", err
	}
	c := t.client()
	ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Second)
	defer cancel()
	var list proxy.ModelList
	if err := c.Get(ctx, "/v1/models", &list); err != nil {
		return nil, "", "", fmt.Errorf("%s: ask the daemon for its models: %w", name, err)
	}
	profiles, err := c.Profiles(ctx)
	if err != nil {
		return nil, "", "", fmt.Errorf("%s: ask the daemon for its profiles: %w", name, err)
	}
	public = baseURL
	if public == "" {
		public = c.BaseURL
	}
	if !loopbackURL(public) {
		tokenEnv = "GPUHOST_API_TOKEN"
		if t.Cfg != nil {
			tokenEnv = t.Cfg.APITokenEnv
		}
	}
	return proxy.OpencodeModels(list, profiles), public, tokenEnv, nil
}

// runAgentClientConfig is client-config for claude-code and codex.
func runAgentClientConfig(cmd *cobra.Command, client string, args []string, baseURL string, write bool) error {
	name := "client-config " + client
	models, public, tokenEnv, err := daemonModels(cmd, name, baseURL)
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	note := func(skipped []proxy.OpencodeSkipped) {
		for _, s := range skipped {
			fmt.Fprintf(stderr, "note: %s\n", s)
		}
	}
	var merge func([]byte) ([]byte, error)
	var what string
	if client == "claude-code" {
		env, skipped, err := proxy.ClaudeCodeEnv(public, models, tokenEnv == "")
		note(skipped)
		if err != nil {
			return err
		}
		if tokenEnv != "" {
			fmt.Fprintf(stderr, "note: the daemon is beyond loopback: run Claude Code with ANTHROPIC_AUTH_TOKEN=\"$%s\" (the token is not written into the file)\n", tokenEnv)
		}
		what = "the env block"
		merge = func(existing []byte) ([]byte, error) {
			out, changed, err := proxy.MergeClaudeCodeSettings(existing, env)
			if err == nil && len(changed) > 0 {
				fmt.Fprintf(stderr, "set %s\n", strings.Join(changed, ", "))
			}
			return out, err
		}
		if !write {
			out, err := json.MarshalIndent(map[string]any{"env": env}, "", "  ")
			if err != nil {
				return err
			}
			if _, err = cmd.OutOrStdout().Write(append(out, '\n')); err != nil {
				return err
			}
			printedOnly(cmd, func() (string, error) { return defaultClientPath(client) })
			return nil
		}
	} else {
		prov, model, skipped, err := proxy.CodexProvider(public, models, tokenEnv)
		note(skipped)
		if err != nil {
			return err
		}
		what = fmt.Sprintf("provider %q (model %s)", proxy.ClientProviderID, model)
		merge = func(existing []byte) ([]byte, error) { return proxy.MergeCodexConfig(existing, prov, model) }
		if !write {
			out, err := toml.Marshal(map[string]any{"model": model, "model_provider": proxy.ClientProviderID,
				"model_providers": map[string]any{proxy.ClientProviderID: prov}})
			if err != nil {
				return err
			}
			if _, err = cmd.OutOrStdout().Write(out); err != nil {
				return err
			}
			printedOnly(cmd, func() (string, error) { return defaultClientPath(client) })
			return nil
		}
	}
	path := ""
	if len(args) == 1 {
		path = args[0]
	} else if path, err = defaultClientPath(client); err != nil {
		return err
	}
	return writeMerged(cmd, name, path, what, merge)
}

// defaultClientPath is the client's own config file: Claude Code's user
// settings, Codex's config.toml under $CODEX_HOME (default ~/.codex).
func defaultClientPath(client string) (string, error) {
	if client == "codex" {
		if dir := os.Getenv("CODEX_HOME"); dir != "" {
			return filepath.Join(dir, "config.toml"), nil
		}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("client-config %s --write: find the home directory (or give PATH): %w", client, err)
	}
	if client == "codex" {
		return filepath.Join(home, ".codex", "config.toml"), nil
	}
	if dir := os.Getenv("CLAUDE_CONFIG_DIR"); dir != "" {
		return filepath.Join(dir, "settings.json"), nil
	}
	return filepath.Join(home, ".claude", "settings.json"), nil
}
