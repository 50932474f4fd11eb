package config

import (
	_ "embed"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"gpuhost/internal/loopback"
	"gpuhost/units"
)

//go:embed demo.yaml
var demoYAML string

// Demo is the embedded default that `gpuhost demo` runs: a simulated
// GPU, simulator backends started by the process runner, three profiles.
// self is the gpuhost binary (the simulator), state a writable directory.
// A profile port that is taken on this machine (another demo, anything
// else) is replaced by a free one, so two demos with their own state
// directory and listen address run side by side; Moved in the result
// says which.
func Demo(self, state, listen string) (*Config, error) {
	r := strings.NewReplacer("{{SELF}}", self, "{{STATE}}", state, "{{LISTEN}}", listen)
	cfg, err := Parse("embedded demo config", []byte(r.Replace(demoYAML)))
	if err != nil {
		return nil, err
	}
	// Checked before anything is started or a port is probed: a demo on
	// a public address without a token is refused as a config error.
	if err := demoListenToken(cfg); err != nil {
		return nil, err
	}
	if err := pickDemoPorts(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// demoListenToken refuses a --listen beyond loopback unless a bearer
// token long enough for that is set (the demo config reads it from
// $GPUHOST_API_TOKEN), with the same rule serve applies.
func demoListenToken(cfg *Config) error {
	if loopback.ListensOnly(cfg.Listen) {
		return nil
	}
	tok, err := cfg.APIToken()
	if err != nil {
		return &Error{File: "embedded demo config", Problems: []string{err.Error()}}
	}
	switch n := len([]rune(tok)); {
	case n == 0:
		return &Error{File: "embedded demo config", Problems: []string{fmt.Sprintf("--listen %s is not loopback: set a bearer token in $%s (at least %d characters, e.g. openssl rand -hex 32)", cfg.Listen, cfg.APITokenEnv, MinTokenLength)}}
	case n < MinTokenLength:
		return &Error{File: "embedded demo config", Problems: []string{fmt.Sprintf("--listen %s is not loopback: the bearer token in $%s has %d characters, at least %d are needed", cfg.Listen, cfg.APITokenEnv, n, MinTokenLength)}}
	}
	return nil
}

// pickDemoPorts moves every profile whose port is busy on loopback to a
// free port (profiles sharing a port keep sharing one), and records the
// moves in cfg.DemoPortMoves.
func pickDemoPorts(cfg *Config) error {
	byPort := map[int][]string{}
	for name, p := range cfg.Profiles {
		byPort[p.Port] = append(byPort[p.Port], name)
	}
	ports := make([]int, 0, len(byPort))
	for port := range byPort {
		ports = append(ports, port)
	}
	sort.Ints(ports)
	for _, port := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			ln.Close()
			continue
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("demo: check port %d of profiles %s: %w", port, strings.Join(byPort[port], ", "), err)
		}
		to, err := loopback.FreePort()
		if err != nil {
			return fmt.Errorf("demo: port %d of profiles %s is busy and no free port was found: %w", port, strings.Join(byPort[port], ", "), err)
		}
		for _, name := range byPort[port] {
			cfg.Profiles[name].Port = to
		}
		if cfg.DemoPortMoves == nil {
			cfg.DemoPortMoves = map[int]int{}
		}
		cfg.DemoPortMoves[port] = to
	}
	return nil
}

// DemoGPUs makes the demo's simulated box n cards (`gpuhost demo --gpus
// n`): n RTX 4090s without P2P, like consumer cards; with two or more, the
// Ollama profile runs on GPU 1 (serving beside GPU 0's), and a copy of the
// gemma profile, gemma3-27b-tp, runs tensor parallel on GPUs 0 and 1, so
// every kind of placement is there to switch to. One card leaves the demo
// as it is.
func (c *Config) DemoGPUs(n int) error {
	if n < 1 || n > maxSimGPUs {
		return &Error{File: "embedded demo config", Problems: []string{fmt.Sprintf("--gpus %d: the simulated box has 1 to %d GPUs", n, maxSimGPUs)}}
	}
	if n == 1 {
		return nil
	}
	c.GPU.Sim.Devices = make([]SimGPUDevice, n)
	if p := c.Profiles["llama3-8b"]; p != nil {
		p.GPUs = units.GPUSet{Indices: []int{1}, Given: true}
	}
	if p := c.Profiles["gemma3-27b"]; p != nil {
		tp := *p
		tp.Name, tp.ServedName = "gemma3-27b-tp", "gemma3-27b-tp"
		tp.GPUs = units.GPUSet{Indices: []int{0, 1}, Given: true}
		c.Profiles[tp.Name] = &tp
	}
	return c.demoLanePorts()
}

// demoLanePorts gives each profile beyond GPU 0's lane a free port of its
// own when its port is another lane's too: profiles on different GPUs may
// serve at once.
func (c *Config) demoLanePorts() error {
	seen := map[int]string{}
	for _, l := range c.Lanes() {
		for _, name := range l.Profiles {
			p := c.Profiles[name]
			if other, ok := seen[p.Port]; !ok || other == l.Slot {
				seen[p.Port] = l.Slot
				continue
			}
			port, err := loopback.FreePort()
			if err != nil {
				return fmt.Errorf("demo: a port of its own for profile %s on %s: %w", name, l.Name(), err)
			}
			p.Port = port
			seen[p.Port] = l.Slot
		}
	}
	return nil
}
