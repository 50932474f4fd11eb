package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/bench"
	"gpuhost/bench/benchcmd"
	"gpuhost/internal/loopback"
	"gpuhost/nvml"
	"gpuhost/units"
)

// daemonBenchEnv is benchEnv without a config file: results under the
// user's state directory, and the daemon (found by the one rule) describes
// its active profile and its GPU itself.
func daemonBenchEnv(cmd *cobra.Command) benchcmd.Env {
	status := func(ctx context.Context) (api.Status, *api.Client, error) {
		c, err := apiClient(cmd)
		if err != nil {
			return api.Status{}, nil, err
		}
		st, err := c.Status(ctx)
		return st, c, err
	}
	var env benchcmd.Env
	env.GPU = func(ctx context.Context) (nvml.Snapshot, error) {
		st, _, err := status(ctx)
		if err == nil && st.GPU == nil {
			err = fmt.Errorf("the daemon reads no GPU: %s", st.GPUError)
		}
		if err != nil {
			return nvml.Snapshot{}, err
		}
		return *st.GPU, nil
	}
	env.Active = func(ctx context.Context) (bench.Target, *units.Profile, error) {
		st, c, err := status(ctx)
		if err != nil {
			return bench.Target{}, nil, fmt.Errorf("no config (%s: not there), so the daemon names its active profile: %w", defaultConfigPath, err)
		}
		var p *units.Profile
		for _, pi := range st.Profiles {
			if pi.Name == st.State.Profile && st.State.Phase == api.PhaseActive {
				p = &units.Profile{Name: pi.Name, Backend: pi.Backend, Model: pi.Model, ServedName: pi.ServedName, Port: pi.Port}
				if pi.ModelParams != nil {
					p.Params = *pi.ModelParams // the roofline
				}
			}
		}
		if p == nil {
			return bench.Target{}, nil, fmt.Errorf("no active profile on the daemon at %s (%s; state %s)", c.BaseURL, c.Origin, st.State.Phase)
		}
		t := bench.ProfileTarget(p, c.BaseURL+"/v1")
		// The backend's extras (/version, /tokenize, /metrics) are on the
		// daemon's machine, on the profile's port.
		if u, err := url.Parse(c.BaseURL); err == nil && !loopback.IsHost(u.Hostname()) {
			t.ServerURL = "http://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(p.Port))
		}
		t.APIKey = c.Token
		return t, p, nil
	}
	return env
}
