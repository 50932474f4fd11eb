package appliance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gpuhost/config"
	"gpuhost/units"
)

// CheckModelCache is the ID of the check that a profile's model is
// complete in its backend user's cache.
const CheckModelCache = "profile.model_cache"

// CheckNetwork is the ID of the check that names a backend unit's network:
// fenced, or opened by backends.<kind>.network: open.
const CheckNetwork = "units.network"

// backendStore is who runs a backend and with which environment, as far as
// the model's location depends on it.
type backendStore struct {
	user, home string
	env        map[string]string // Environment= of the unit and its drop-ins
	from       string            // where user and env were read
}

// unitStore reads User= and Environment= of the backend's unit file and its
// drop-ins (where an operator sets HF_HOME or OLLAMA_MODELS with
// `systemctl edit`); without systemd, or when the files cannot be read, it
// takes the user from the config. The home is HOME from that environment,
// else the user's home from the user database, else, for the default user
// that scripts/install.sh creates, units.DefaultBackendHome.
func unitStore(ctx context.Context, cfg *config.Config, us Units, b units.Backend) (backendStore, error) {
	bc := cfg.BackendFor(b)
	st := backendStore{user: bc.User, env: map[string]string{}, from: "config backends." + string(b) + ".user"}
	if bc.User == "" {
		st.user = "root"
	}
	if us != nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		status, err := us.Unit(cctx, bc.Unit)
		cancel()
		if err == nil && status.FragmentPath != "" {
			if u, env, ok := readUnitEnv(append([]string{status.FragmentPath}, status.DropInPaths...)); ok {
				st.env, st.from = env, bc.Unit
				st.user = "root"
				if u != "" {
					st.user = u
				}
			}
		}
	}
	if h := st.env["HOME"]; h != "" {
		st.home = h
		return st, nil
	}
	switch u, err := user.Lookup(st.user); {
	case err == nil:
		st.home = u.HomeDir
	case st.user == units.DefaultBackendUser:
		st.home = units.DefaultBackendHome
	default:
		if u, err2 := user.LookupId(st.user); err2 == nil {
			st.home = u.HomeDir
			return st, nil
		}
		return st, fmt.Errorf("%w: backend user %q (%s) not found: %v", errUndecidable, st.user, st.from, err)
	}
	return st, nil
}

// readUnitEnv reads the last User= and the environment of unit files in
// order: the accumulated Environment= (an empty one resets the list, as in
// systemd), then the EnvironmentFile= files, whose assignments win (also
// as in systemd; a missing '-' file is skipped). ok is false when the first
// file cannot be read.
func readUnitEnv(paths []string) (usr string, env map[string]string, ok bool) {
	env = map[string]string{}
	var envFiles []string
	defer func() {
		for _, f := range envFiles {
			if raw, err := os.ReadFile(strings.TrimPrefix(f, "-")); err == nil {
				maps.Copy(env, units.ParseEnvFile(string(raw)))
			}
		}
	}()
	for i, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			if i == 0 {
				return "", nil, false
			}
			continue
		}
		uf, err := units.ParseUnitFile(string(raw))
		if err != nil {
			continue
		}
		if v := uf.Values("Service", "User"); len(v) > 0 {
			usr = v[len(v)-1]
		}
		for _, f := range uf.Values("Service", "EnvironmentFile") {
			if f == "" {
				envFiles = nil
			} else {
				envFiles = append(envFiles, f)
			}
		}
		for _, line := range uf.Values("Service", "Environment") {
			if strings.TrimSpace(line) == "" {
				env = map[string]string{}
				continue
			}
			words, err := units.SplitExecStart(line)
			if err != nil {
				continue
			}
			for _, w := range words {
				if k, v, found := strings.Cut(w, "="); found {
					env[k] = v
				}
			}
		}
	}
	return usr, env, true
}

// vllmFlag is the value of a flag a profile passes in extra_args ("" when
// not given).
func vllmFlag(p *units.Profile, flag string) string {
	x := p.VLLM.ExtraArgs
	for i, a := range x {
		if a == flag && i+1 < len(x) {
			return x[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// modelCacheCheck says whether p's model is complete where its backend's
// server will look for it, and on a miss names the command that fetches
// it as the backend user. A miss fails only where the server cannot
// download it (a fenced unit, or a profile told it is offline); where the
// cache cannot be read (the user unknown, permissions) it warns, so a
// switch is never refused on a guess. Simulated backends have no cache.
func modelCacheCheck(ctx context.Context, cfg *config.Config, us Units, p *units.Profile) units.Check {
	c := units.Check{ID: CheckModelCache, Value: p.Model}
	bc := cfg.BackendFor(p.Backend)
	if bc.Simulated {
		c.Severity, c.Value = units.SeverityOK, "skipped"
		c.Message = "simulated backend: no model cache to check"
		return c
	}
	st, err := unitStore(ctx, cfg, us, p.Backend)
	var res cacheResult
	var fetch string
	if err == nil {
		res, fetch, err = lookModel(st, bc, p)
	}
	switch {
	case errors.Is(err, errUndecidable):
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("cannot tell whether %s is in the cache of %s: %v", p.Model, st.user, err)
		c.Fix = fmt.Sprintf("gpuhost.service (root without CAP_DAC_READ_SEARCH) reads the cache through the group %s (SupplementaryGroups=, rendered for the default backend user): keep the home and cache group-readable, or run `gpuhost doctor` as root on the box", st.user)
	case err != nil:
		c.Severity, c.Message = units.SeverityWarn, err.Error()
	case len(res.Missing) == 0:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("%s is complete in %s's cache: %s (%s)", p.Model, st.user, res.Path, res.Found)
	default:
		c.Severity = units.SeverityFail
		c.Message = fmt.Sprintf("%s is not complete in %s's cache (%s): missing %s; the %s unit has no network to fetch it",
			p.Model, st.user, res.Path, strings.Join(res.Missing, ", "), p.Backend)
		c.Fix = "fetch it as the backend user: " + fetch
		if bc.Adopt || !p.Offline() {
			c.Severity = units.SeverityWarn
			c.Message = fmt.Sprintf("%s is not complete in %s's cache (%s): missing %s; the server will try to download it at start",
				p.Model, st.user, res.Path, strings.Join(res.Missing, ", "))
		}
	}
	return c
}

// lookModel looks p's model up in st and returns the fetch command for a
// miss.
func lookModel(st backendStore, bc config.BackendConfig, p *units.Profile) (cacheResult, string, error) {
	if p.Backend == units.Ollama {
		store := ollamaModelsDir(st.env, st.home)
		res, err := ollamaModel(store, p.Model)
		// `ollama pull` asks a server to download; the backend's own server
		// has no network, so a short-lived one runs as the backend user.
		bin := "ollama"
		if len(bc.Exec) > 0 && filepath.Base(bc.Exec[0]) == "ollama" {
			bin = bc.Exec[0]
		}
		fetch := fmt.Sprintf("sudo -u %s env HOME=%s OLLAMA_MODELS=%s OLLAMA_HOST=127.0.0.1:11499 sh -c '%s serve >/dev/null 2>&1 & s=$!; sleep 3; %s pull %s; kill $s'",
			st.user, st.home, store, bin, bin, p.Model)
		return res, fetch, err
	}
	hub := hfHubDir(st.env, st.home)
	rev := vllmFlag(p, "--revision")
	res, err := hfModel(hub, p.Model, rev)
	if vllmFlag(p, "--tokenizer") != "" {
		// The tokenizer comes from elsewhere; this check does not follow it.
		res.Missing = slices.DeleteFunc(res.Missing, func(m string) bool { return strings.HasPrefix(m, "a tokenizer") })
	}
	hfHome := filepath.Dir(hub)
	fetch := fmt.Sprintf("sudo -u %s env HOME=%s HF_HOME=%s hf download %s", st.user, st.home, hfHome, p.Model)
	if st.env["HF_HUB_CACHE"] != "" {
		fetch = fmt.Sprintf("sudo -u %s env HOME=%s HF_HUB_CACHE=%s hf download %s", st.user, st.home, hub, p.Model)
	}
	if rev != "" {
		fetch += " --revision " + rev
	}
	if filepath.IsAbs(p.Model) {
		fetch = fmt.Sprintf("copy the model's files (config.json, tokenizer, weights) into %s, readable by %s", p.Model, st.user)
	}
	return res, fetch, err
}

// networkChecks name each rendered backend unit's network: fenced (the
// default), or opened by backends.<kind>.network: open, with the profiles
// that then run without the offline settings.
func networkChecks(cfg *config.Config) []units.Check {
	var out []units.Check
	for _, b := range []units.Backend{units.VLLM, units.Ollama} {
		bc := cfg.BackendFor(b)
		c := units.Check{ID: CheckNetwork, Value: string(bc.Network)}
		var open []string
		for _, name := range cfg.ProfileNames() {
			if p := cfg.Profiles[name]; p != nil && p.Backend == b && !p.Offline() {
				open = append(open, name)
			}
		}
		switch {
		case bc.Adopt:
			c.Severity, c.Value = units.SeverityOK, "adopted"
			c.Message = fmt.Sprintf("%s is the operator's unit: its network is its own", bc.Unit)
		case bc.Network == units.NetworkOpen:
			c.Severity = units.SeverityWarn
			c.Message = fmt.Sprintf("%s is NOT fenced (backends.%s.network: open): no PrivateNetwork=, its API is on the host's loopback; profiles without the offline settings (network: open): %s",
				bc.Unit, b, orNone(open))
			c.Fix = fmt.Sprintf("fetch the models into the backend user's cache, remove backends.%s.network (and the profiles' network: open), then `gpuhost units install`", b)
		default:
			c.Severity = units.SeverityOK
			c.Message = fmt.Sprintf("%s is fenced (PrivateNetwork=yes) and its profiles run with %s", bc.Unit, offlineWords(b))
		}
		out = append(out, c)
	}
	return out
}

func offlineWords(b units.Backend) string {
	var w []string
	for _, e := range units.OfflineEnv(b) {
		w = append(w, e.String())
	}
	return strings.Join(w, " ")
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
