package config

import (
	"slices"
	"sort"

	"gpuhost/units"
)

// backendPorts lists the ports of b's profiles, sorted and without repeats.
func (c *Config) backendPorts(b units.Backend) []int {
	var ports []int
	for _, p := range c.Profiles {
		if p != nil && p.Backend == b && p.Port > 0 {
			ports = append(ports, p.Port)
		}
	}
	sort.Ints(ports)
	return slices.Compact(ports)
}

// BackendSockets maps each profile port to the unix socket that reaches
// its backend under the systemd runner, where a rendered backend unit has
// a private network and is reachable only through its socket units
// (units.RenderProxyUnits). Ports of an adopted unit, and every port under
// the process runner, are absent: those backends are dialled on loopback
// TCP. The result is what backend.Dialer needs.
func (c *Config) BackendSockets() map[int]string {
	if c.Systemd.Runner != "systemd" {
		return nil
	}
	out := map[int]string{}
	for _, bu := range c.BackendUnits() {
		if bu.Adopt {
			continue
		}
		for _, port := range bu.Ports {
			out[port] = units.ProxySocketPath(bu.Name, port)
		}
	}
	return out
}

// socketsValidate refuses, under the systemd runner, a port that profiles
// of both backends use: each backend has its own network namespace and
// socket per port, and gpuhost dials a profile's backend by its port.
func (c *Config) socketsValidate(add func(key, format string, args ...any)) {
	if c.Systemd.Runner != "systemd" {
		return
	}
	vllm := c.backendPorts(units.VLLM)
	for _, port := range c.backendPorts(units.Ollama) {
		if _, shared := slices.BinarySearch(vllm, port); shared {
			add("profiles", "port %d is used by a vllm and an ollama profile; under systemd each backend is reached through its own socket per port, so give the backends different ports", port)
		}
	}
}
