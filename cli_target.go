package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/loopback"
)

// DefaultDaemonURL is where the CLI looks for the daemon when nothing else
// names it (the demo's and the example config's listen address).
const DefaultDaemonURL = "http://127.0.0.1:8080"

// envDaemonURL names the daemon for every command that talks to one.
const envDaemonURL = "GPUHOST_URL"

// daemonTarget is the daemon a command talks to, and how it was chosen.
type daemonTarget struct {
	URL string
	// Origin says where URL came from and, for a fallback, what was
	// tried before it.
	Origin string
	// Explicit: --url or $GPUHOST_URL named it, so no local fallback.
	Explicit bool
	// Cfg is the config when it was readable (nil otherwise); CfgErr why
	// it was not.
	Cfg    *config.Config
	CfgErr error
}

// defaultConfigPath is config.DefaultPath (a variable for the
// tests).
var defaultConfigPath = config.DefaultPath

// resolveDaemon applies the one rule for every command that talks to a
// box: --url, else $GPUHOST_URL, else the config's listen (only when a
// config file is readable), else DefaultDaemonURL. An explicit --config
// that cannot be read is an error; the default path missing is not.
func resolveDaemon(cmd *cobra.Command) (daemonTarget, error) {
	var t daemonTarget
	if f := cmd.Flags().Lookup("url"); f != nil && f.Value.String() != "" {
		t.URL, t.Origin, t.Explicit = f.Value.String(), "from --url", true
	} else if v := strings.TrimSpace(os.Getenv(envDaemonURL)); v != "" {
		t.URL, t.Origin, t.Explicit = v, "from $"+envDaemonURL, true
	}
	if t.Explicit {
		if err := checkDaemonURL(t.URL); err != nil {
			return t, usageError{fmt.Errorf("%s %q: %w", strings.TrimPrefix(t.Origin, "from "), t.URL, err)}
		}
	}
	path, _ := cmd.Flags().GetString("config")
	explicitCfg := path != ""
	t.Cfg, t.CfgErr = loadConfig(cmd)
	if t.CfgErr != nil && explicitCfg {
		return t, t.CfgErr
	}
	if t.Explicit {
		return t, nil
	}
	if t.Cfg != nil {
		host, port, _ := net.SplitHostPort(t.Cfg.Listen)
		t.URL = "http://" + net.JoinHostPort(loopback.DialHost(host), port)
		t.Origin = "from listen in " + t.Cfg.Path() + "; no --url or $" + envDaemonURL
		return t, nil
	}
	if path == "" {
		path = defaultConfigPath
	}
	t.URL = DefaultDaemonURL
	t.Origin = fmt.Sprintf("the default; tried --url (not given), $%s (not set), config %s (%s)", envDaemonURL, path, shortCfgErr(t.CfgErr))
	return t, nil
}

// checkDaemonURL refuses an address that is not an http(s) URL with a
// host, before anything is dialled: a bad --url is the caller's usage
// error, not an unreachable daemon.
func checkDaemonURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return err
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an http:// or https:// URL, e.g. " + DefaultDaemonURL)
	case u.Host == "":
		return errors.New("no host in the URL, e.g. " + DefaultDaemonURL)
	}
	return nil
}

// shortCfgErr says why a config was not used, in a few words.
func shortCfgErr(err error) string {
	switch {
	case err == nil:
		return "not read"
	case errors.Is(err, os.ErrNotExist):
		return "not there"
	case errors.Is(err, os.ErrPermission):
		return "not readable"
	}
	return err.Error()
}

// client is the API client for t. The token: $GPUHOST_API_TOKEN, else the
// config's token (api_token_env or api_token_file) when the config was read.
func (t daemonTarget) client() *api.Client {
	tok := os.Getenv("GPUHOST_API_TOKEN")
	if tok == "" && t.Cfg != nil {
		tok, _ = t.Cfg.APIToken()
	}
	c := api.NewClient(t.URL, tok)
	c.Origin = t.Origin
	return c
}

// apiClient returns a client for the daemon resolveDaemon names.
func apiClient(cmd *cobra.Command) (*api.Client, error) {
	t, err := resolveDaemon(cmd)
	if err != nil {
		return nil, err
	}
	return t.client(), nil
}

// urlFlag adds the common --url flag.
func urlFlag(cmd *cobra.Command) {
	cmd.Flags().String("url", "", "daemon API base URL (default: $"+envDaemonURL+", else the config's listen, else "+DefaultDaemonURL+")")
}

// isUnreachable: the daemon gave no HTTP answer at all.
func isUnreachable(err error) bool {
	var ue *api.UnreachableError
	return errors.As(err, &ue)
}
