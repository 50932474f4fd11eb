package simulator

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"gpuhost/units"
)

// A real vLLM in a unit without a network (PrivateNetwork=yes) resolves its
// model through the Hugging Face hub at start and fails or waits on timeouts
// unless it is told it is offline (units.OfflineEnv). The simulator talks to
// no hub, so on its own it would start either way and no test would notice
// a unit that lost those settings. It therefore refuses to start where the
// hub is unreachable and the settings are missing, as the strictest real
// backend would.

// The values of --network.
const (
	// NetworkAuto: fenced when systemd runs the simulator (INVOCATION_ID is
	// set) in a network namespace with nothing but loopback, which is what
	// the rendered units' PrivateNetwork=yes gives. Outside systemd (the
	// demo's process runner, tests that start it directly) it is open.
	NetworkAuto = "auto"
	// NetworkFenced: the hub is unreachable, whatever the interfaces say.
	NetworkFenced = "fenced"
	// NetworkOpen: the hub is reachable; no check.
	NetworkOpen = "open"
)

// ErrNotOffline is the refusal of a fenced start without the offline
// settings: a configuration error of the unit (gpuhost simulate exits 78).
var ErrNotOffline = errors.New("not told it is offline")

// onlyLoopback reports whether every network interface the process sees is
// a loopback one (a fresh network namespace has only lo). A failure to list
// them counts as not fenced: the check must not stop a simulator on a guess.
var onlyLoopback = func() bool {
	ifs, err := net.Interfaces()
	if err != nil {
		return false
	}
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback == 0 {
			return false
		}
	}
	return true
}

// hubUnreachable decides --network for the environment getenv reads.
func hubUnreachable(mode string, getenv func(string) string) (bool, error) {
	switch mode {
	case "", NetworkAuto:
		return getenv("INVOCATION_ID") != "" && onlyLoopback(), nil
	case NetworkFenced:
		return true, nil
	case NetworkOpen:
		return false, nil
	}
	return false, fmt.Errorf("--network %q: want %s, %s or %s", mode, NetworkAuto, NetworkFenced, NetworkOpen)
}

// checkOffline refuses a start without the offline settings where the hub
// is unreachable; the error names what is missing and where it belongs.
func checkOffline(flavor Flavor, mode string, getenv func(string) string) error {
	fenced, err := hubUnreachable(mode, getenv)
	if err != nil || !fenced {
		return err
	}
	missing := units.MissingOffline(units.Backend(flavor), getenv)
	if len(missing) == 0 {
		return nil
	}
	want := make([]string, 0, len(units.OfflineEnv(units.Backend(flavor))))
	for _, e := range units.OfflineEnv(units.Backend(flavor)) {
		want = append(want, e.String())
	}
	return fmt.Errorf("simulated %s refuses to start (%w): the network is fenced (%s unreachable) and %s %s not set; "+
		"a real %s would %s. The unit gpuhost renders sets %s (Environment= and the environment file); "+
		"render it again with `gpuhost units install`, or open the unit (backends.%s.network: open)",
		flavor, ErrNotOffline, pickS(flavor == FlavorVLLM, "the Hugging Face hub is", "ollama.com is"),
		strings.Join(missing, ", "), pickS(len(missing) == 1, "is", "are"), flavor,
		pickS(flavor == FlavorVLLM, "fail or wait on timeouts resolving its model", "offer cloud models that cannot answer"),
		strings.Join(want, " "), flavor)
}
