package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/triage"
)

// The triage commands without a config file: `triage mail --eml FILE` is
// classified through the running daemon's /v1 (found by the one rule,
// resolveDaemon); the commands that need the mailbox (run, once, mail
// --uid) say which file and keys they need.

// configMissing reports that the config was simply not there: no --config
// given and the default path does not exist. An explicit --config that
// cannot be read, or a config that does not load, stays an error.
func configMissing(cmd *cobra.Command, err error) bool {
	path, _ := cmd.Flags().GetString("config")
	return path == "" && errors.Is(err, os.ErrNotExist)
}

// loadTriageConfig reads the config for a command that needs the mailbox
// (what, e.g. "gpuhost triage once").
func loadTriageConfig(cmd *cobra.Command, what string) (*config.Config, error) {
	cfg, err := loadConfig(cmd)
	if err != nil && configMissing(cmd, err) {
		return nil, noTriageConfigError(cmd, what)
	}
	return cfg, err
}

// noTriageConfigError says what a mailbox command needs, what was tried,
// and what the daemon (when one answers) does about mail already.
func noTriageConfigError(cmd *cobra.Command, what string) error {
	msg := fmt.Sprintf("%s needs the mailbox of a config's triage: section (triage.enabled: true, triage.source: imap or maildir), "+
		"and there is no config: tried --config (not given), %s (not there). Give --config FILE", what, defaultConfigPath)
	if note := daemonTriageNote(cmd); note != "" {
		msg += "; " + note
	}
	return configError{errors.New(msg + "; one mail without a config: gpuhost triage mail --eml FILE (classified through the daemon's /v1)")}
}

// daemonTriageNote tells, in a few words, whether the daemon the rule finds
// runs a triage worker of its own; "" when no daemon answers there.
func daemonTriageNote(cmd *cobra.Command) string {
	t, err := resolveDaemon(cmd)
	if err != nil {
		return ""
	}
	c := t.client()
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	var resp triage.APIResponse
	err = c.Get(ctx, "/api/triage?limit=0", &resp)
	var re *api.RemoteError
	switch {
	case err == nil:
		return fmt.Sprintf("the daemon at %s (%s) polls its own mailbox %s (%d mail(s) processed; GET %s/api/triage lists them)",
			c.BaseURL, t.Origin, resp.State.Mailbox, resp.State.Processed, c.BaseURL)
	case errors.As(err, &re) && re.Status == http.StatusNotFound:
		return fmt.Sprintf("the daemon at %s (%s) runs no triage worker (triage.enabled is false in its config)", c.BaseURL, t.Origin)
	}
	return ""
}

// openTriageMail opens the worker of `triage mail`: the config's, or,
// without a config file and when handFedOK (--eml), one that classifies
// through the daemon's /v1 (handFed true).
func openTriageMail(cmd *cobra.Command, handFedOK bool) (w *triage.Worker, closeFn func(), handFed bool, err error) {
	cfg, err := loadConfig(cmd)
	switch {
	case err == nil:
		w, closeFn, err = openTriage(cmd, cfg)
		return w, closeFn, false, err
	case !configMissing(cmd, err):
		return nil, nil, false, err
	case !handFedOK:
		return nil, nil, false, noTriageConfigError(cmd, "gpuhost triage mail --uid")
	}
	w, closeFn, err = openHandFed(cmd)
	return w, closeFn, true, err
}

// openHandFed builds the worker for one hand-fed mail without a config:
// the triage defaults, the daemon's /v1 on its active model; it says so on
// stderr.
func openHandFed(cmd *cobra.Command) (*triage.Worker, func(), error) {
	log, err := newLogger(cmd)
	if err != nil {
		return nil, nil, err
	}
	t, err := resolveDaemon(cmd)
	if err != nil {
		return nil, nil, err
	}
	c := t.client()
	ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
	st, err := c.Status(ctx)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("no config (%s: not there), so the mail is classified through the daemon's /v1: %w", defaultConfigPath, err)
	}
	model := st.ActiveServedName()
	if model == "" {
		return nil, nil, fmt.Errorf("no config (%s: not there), so the mail is classified on the daemon's active model, but the daemon at %s (%s) has none (state %s): switch to a profile first (gpuhost switch PROFILE), or give --config",
			defaultConfigPath, c.BaseURL, t.Origin, st.State.Phase)
	}
	tc := config.DefaultTriage()
	tc.Enabled = true
	tc.Model.Model = model
	if c.Token != "" {
		tc.Model.APIKeyEnv = "GPUHOST_API_TOKEN" // no config: the token can only have come from there
	}
	dir, err := os.MkdirTemp("", "gpuhost-triage-")
	if err != nil {
		return nil, nil, err
	}
	w, err := triage.HandFed(tc, dir, triage.Deps{Log: log.With("component", "triage"), ManagedBaseURL: c.BaseURL + "/v1", Stdout: cmd.OutOrStdout()})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "no config (tried --config: not given, %s: not there): classifying on %s at %s/v1 (%s) with the triage defaults; no rules, CRM lookup or sinks, so nothing is posted\n",
		defaultConfigPath, model, c.BaseURL, t.Origin)
	return w, func() { _ = w.Close(); os.RemoveAll(dir) }, nil
}
