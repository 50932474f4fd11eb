package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"gpuhost/internal/exitclass"
	"gpuhost/internal/loopback"
	"gpuhost/units"
)

// DefaultPath is where a packaged install keeps its configuration.
const DefaultPath = "/etc/gpuhost/gpuhost.yaml"

// Example is the commented example shipped in the repository; `gpuhost
// units install` copies it to DefaultPath when none exists.
//
//go:embed gpuhost.example.yaml
var Example []byte

// Config is the whole gpuhost.yaml. Every field has a yaml key; unknown keys
// are load errors so that a typo never silently falls back to a default.
type Config struct {
	Listen      string `yaml:"listen"`        // API address (default 127.0.0.1:8080); anything but loopback needs a bearer token.
	StateDir    string `yaml:"state_dir"`     // Last wanted profile, per-unit environment files, standby residuals, bench results (default /var/lib/gpuhost).
	APITokenEnv string `yaml:"api_token_env"` // The environment variable holding the API token (default GPUHOST_API_TOKEN).
	// APITokenFile is read at start; it wins over APITokenEnv when both are set.
	APITokenFile   string                    `yaml:"api_token_file"`
	GPU            GPUConfig                 `yaml:"gpu"`
	Systemd        SystemdConfig             `yaml:"systemd"`
	Backends       BackendsConfig            `yaml:"backends"`
	Switch         SwitchConfig              `yaml:"switch"`
	Heal           HealConfig                `yaml:"heal"`
	DefaultProfile string                    `yaml:"default_profile"` // The profile a fresh box (no state.json) and the demo switch to.
	Policy         *units.Policy             `yaml:"policy"`          // The utilisation and max_num_seqs ceilings the doctor checks (default: measured on the reference RTX 4090).
	Profiles       map[string]*units.Profile `yaml:"profiles"`
	Proxy          ProxyConfig               `yaml:"proxy"`
	Panel          PanelConfig               `yaml:"panel"`
	Telegram       TelegramConfig            `yaml:"telegram"`
	Metrics        MetricsConfig             `yaml:"metrics"`
	MCP            MCPConfig                 `yaml:"mcp"`
	Bench          BenchConfig               `yaml:"bench"`
	Triage         TriageConfig              `yaml:"triage"`
	Agent          AgentConfig               `yaml:"agent"`
	HTTP           HTTPConfig                `yaml:"http"`

	// DemoPortMoves: profile ports the demo found busy, and the free ports
	// it used instead (Demo only).
	DemoPortMoves map[int]int `yaml:"-" json:"-"`

	// path is the file this config came from, for messages.
	path string
	// keyLines maps a key path (e.g. "backends.vllm.user") to its line in
	// the file, so that value errors name the line as well as the key.
	keyLines map[string]int
	// lane is set on a config LaneConfig made for one lane.
	lane *laneInfo
}

// Duration is a time.Duration that reads "1.5s" style strings from YAML.
type Duration time.Duration

// UnmarshalYAML accepts Go duration strings, so the config reads like the docs.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration such as \"90s\"", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: invalid duration %q (want e.g. \"90s\", \"15m\")", n.Line, s)
	}
	if v < 0 {
		return fmt.Errorf("line %d: duration %q is negative", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the Go duration form back.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the standard library value.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Error lists every problem of one config file, each naming its key.
type Error struct {
	File     string
	Problems []string
}

func (e *Error) Error() string {
	return fmt.Sprintf("config %s: %s", e.File, strings.Join(e.Problems, "; "))
}

// ExitClass: an invalid config ends a command with the configuration
// status (78).
func (e *Error) ExitClass() exitclass.Class { return exitclass.Config }

// Load reads, decodes, defaults and validates a config file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, exitclass.ConfigErr(fmt.Errorf("read config: %w", err))
	}
	return Parse(path, data)
}

// Parse is Load on bytes; name is used in messages.
func Parse(name string, data []byte) (*Config, error) {
	cerr := &Error{File: name}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		cerr.Problems = append(cerr.Problems, "invalid YAML: "+strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, cerr
	}
	if len(root.Content) == 0 {
		cerr.Problems = append(cerr.Problems, "file is empty")
		return nil, cerr
	}
	lines := map[int]string{}
	keyLines := map[string]int{}
	walkKeys(root.Content[0], reflect.TypeOf(Config{}), "", 0, lines, keyLines, &cerr.Problems)
	if len(cerr.Problems) > 0 {
		return nil, cerr
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		cerr.Problems = append(cerr.Problems, describeDecodeError(err, lines)...)
		return nil, cerr
	}
	c.path = name
	c.keyLines = keyLines
	c.applyDefaults()
	cerr.Problems = append(cerr.Problems, c.validate()...)
	if len(cerr.Problems) > 0 {
		return nil, cerr
	}
	return &c, nil
}

// walkKeys checks every mapping key against the struct it decodes into,
// records the key path of each line (to translate decoder errors) and the
// line of each key path (for value errors), and reports unknown keys by
// their full path.
func walkKeys(n *yaml.Node, t reflect.Type, path string, depth int, lines map[int]string, keyLines map[string]int, problems *[]string) {
	if depth > 32 {
		return // deeper than any config key; aliases can make cycles
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if path != "" {
		if _, ok := lines[n.Line]; !ok {
			lines[n.Line] = path
		}
	}
	if t == reflect.TypeOf(yaml.Node{}) {
		return // a section its owner decodes and checks itself (mcp connectors)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return // type error: the decoder reports it with the line
		}
		fields := map[string]reflect.Type{}
		var names []string
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if tag == "" || tag == "-" || !f.IsExported() {
				continue
			}
			fields[tag] = f.Type
			names = append(names, tag)
		}
		sort.Strings(names)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := joinKey(path, k.Value)
			lines[k.Line] = p
			keyLines[p] = k.Line
			ft, ok := fields[k.Value]
			if !ok {
				*problems = append(*problems, fmt.Sprintf("%s (line %d): unknown key (known keys here: %s)", p, k.Line, strings.Join(names, ", ")))
				continue
			}
			walkKeys(v, ft, p, depth+1, lines, keyLines, problems)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := joinKey(path, k.Value)
			lines[k.Line] = p
			keyLines[p] = k.Line
			walkKeys(v, t.Elem(), p, depth+1, lines, keyLines, problems)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, v := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			keyLines[p] = v.Line
			walkKeys(v, t.Elem(), p, depth+1, lines, keyLines, problems)
		}
	}
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var lineRE = regexp.MustCompile(`line (\d+): (.*)`)

// describeDecodeError turns yaml.v3's "line N: cannot unmarshal …" into
// messages that start with the key path.
func describeDecodeError(err error, lines map[int]string) []string {
	var te *yaml.TypeError
	msgs := []string{err.Error()}
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		m = strings.TrimPrefix(m, "yaml: ")
		if sm := lineRE.FindStringSubmatch(m); sm != nil {
			ln, _ := strconv.Atoi(sm[1])
			if key, ok := lines[ln]; ok {
				out = append(out, fmt.Sprintf("%s (line %d): %s", key, ln, sm[2]))
				continue
			}
		}
		out = append(out, m)
	}
	return out
}

func (c *Config) applyDefaults() {
	c.triageDefaults()
	c.agentDefaults()
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.APITokenEnv == "" {
		c.APITokenEnv = "GPUHOST_API_TOKEN"
	}
	c.gpuDefaults()
	c.systemdDefaults()
	c.backendsDefaults()
	c.switchDefaults()
	c.healDefaults()
	c.proxyDefaults()
	c.httpDefaults()
	c.mcpDefaults()
	c.benchDefaults()
	c.telegramDefaults()
	c.profilesDefaults()
}

func (c *Config) validate() []string {
	var ps []string
	add := func(key, format string, args ...any) {
		// A key written in the file gets its line; a defaulted one has none.
		if ln, ok := c.keyLines[key]; ok {
			key = fmt.Sprintf("%s (line %d)", key, ln)
		}
		ps = append(ps, key+": "+fmt.Sprintf(format, args...))
	}
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		add("listen", "%q is not host:port: %v", c.Listen, err)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		add("listen", "port %q is not a number in 0..65535", port)
	} else if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		add("listen", "host %q must be an IP address or localhost", host)
	}
	// state_dir reaches gpuhost.service (ReadWritePaths=, a space-separated
	// list) and the backend units (EnvironmentFile=).
	if err := unitPath(c.StateDir); err != nil {
		add("state_dir", "%v", err)
	}
	c.gpuValidate(add)
	c.systemdValidate(add)
	c.backendsValidate(add, len(ps) == 0)
	c.profilesValidate(add)
	c.socketsValidate(add)
	c.lanesValidate(add)
	c.proxyValidate(add)
	c.telegramValidate(add)
	c.switchValidate(add)
	c.healValidate(add)
	c.triageValidate(add)
	c.agentValidate(add)
	c.httpValidate(add)
	c.mcpValidate(add)
	c.benchValidate(add)
	c.panelValidate(add)
	return ps
}

// unitValue refuses what must never reach a unit file or an environment
// file, where a newline would start a new setting (an injected
// ExecStartPre= or User=root): control characters and invalid UTF-8.
func unitValue(v string) error {
	if !utf8.ValidString(v) {
		return fmt.Errorf("%q is not valid UTF-8", v)
	}
	if i := strings.IndexFunc(v, unicode.IsControl); i >= 0 {
		return fmt.Errorf("%q contains the control character %U; values that reach a unit file must be one visible line", v, []rune(v[i:])[0])
	}
	return nil
}

// unitPath checks a folder that reaches a unit file: absolute, clean (no
// "..", "." or doubled and trailing slashes), and free of control
// characters, whitespace, quotes and backslashes, which systemd's
// space-separated path lists (ReadWritePaths=) would split or unescape.
func unitPath(p string) error {
	if err := unitValue(p); err != nil {
		return err
	}
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%q must be an absolute path", p)
	}
	if filepath.Clean(p) != p {
		return fmt.Errorf("%q must be a clean path (write %q)", p, filepath.Clean(p))
	}
	if strings.ContainsFunc(p, func(r rune) bool { return unicode.IsSpace(r) || strings.ContainsRune(`"'\`, r) }) {
		return fmt.Errorf("%q must not contain whitespace, quotes or backslashes", p)
	}
	return nil
}

// BackendUnits returns the backend units as the pure units package
// describes them: per lane (GPU 0's first) vllm then ollama; GPU 0's lane
// has both, the configured names, another lane those its profiles use
// (LaneUnit). Units whose lanes share a GPU conflict, unless a profile uses
// standby (then two may run at once, one asleep, and gpuhost enforces the
// exclusion itself). A lane's config returns its own units.
func (c *Config) BackendUnits() []units.BackendUnit {
	all, _ := c.Root().placedUnits()
	if c.lane == nil {
		return all
	}
	var out []units.BackendUnit
	for _, u := range all {
		if u.Name == c.Backends.VLLM.Unit || u.Name == c.Backends.Ollama.Unit {
			out = append(out, u)
		}
	}
	return out
}

// placedUnits builds every lane's units and the GPUs each runs on.
func (c *Config) placedUnits() ([]units.BackendUnit, [][]int) {
	standby := c.StandbyUsed()
	var (
		out  []units.BackendUnit
		gpus [][]int
	)
	for _, l := range c.Lanes() {
		lc := c.LaneConfig(l)
		for _, b := range []units.Backend{units.VLLM, units.Ollama} {
			if !lc.UsesBackend(b) {
				continue
			}
			bc := lc.BackendFor(b)
			u := units.BackendUnit{
				Backend: b,
				Name:    bc.Unit,
				Adopt:   bc.Adopt,
				Exec:    bc.Exec,
				EnvFile: lc.EnvFilePath(bc.Unit),
				User:    bc.User,
				Standby: standby,
				// A backend this config does not own (adopted) keeps its own
				// network settings; only a rendered unit is fenced or opened.
				NetworkOpen: bc.Network == units.NetworkOpen,
			}
			u.ReadWritePaths = append(u.ReadWritePaths, bc.ReadWritePaths...)
			u.Ports = lc.backendPorts(b)
			if bc.Simulated && c.GPU.Backend == "sim" {
				// `gpuhost simulate` writes the simulated GPU's state there.
				u.ReadWritePaths = append(u.ReadWritePaths, c.GPU.SimDir)
			}
			out = append(out, u)
			gpus = append(gpus, l.GPUs)
		}
	}
	if !standby {
		for i := range out {
			for j := range out {
				if i != j && (Lane{GPUs: gpus[i]}).Shares(Lane{GPUs: gpus[j]}) {
					out[i].Conflicts = append(out[i].Conflicts, out[j].Name)
				}
			}
		}
	}
	return out, gpus
}

// DefaultStateDir is state_dir's default, the folder gpuhost.service's
// StateDirectory=gpuhost makes writable.
const DefaultStateDir = "/var/lib/gpuhost"

// DaemonUnit describes gpuhost.service for this config: binary and
// configPath are where the installed gpuhost and its config live. A
// state_dir or unit_dir other than the defaults is added to
// ReadWritePaths=: under ProtectSystem=strict it would be read-only, and
// every switch would fail when it writes the backend's environment file. So
// is a simulated GPU's sim_dir outside state_dir.
func (c *Config) DaemonUnit(binary, configPath string) units.DaemonUnit {
	d := units.DaemonUnit{Binary: binary, Config: configPath, WatchdogSec: units.DefaultWatchdogSec}
	if _, port, err := net.SplitHostPort(c.Listen); err == nil {
		if n, err := strconv.Atoi(port); err == nil && n > 0 && n < 1024 {
			d.BindPrivilegedPort = true
		}
	}
	for _, bu := range c.BackendUnits() {
		d.Sockets = append(d.Sockets, bu.ProxySocketUnits()...)
	}
	for _, bc := range []BackendConfig{c.Backends.VLLM, c.Backends.Ollama} {
		// Only the default user's group is known to exist (scripts/install.sh
		// and the package create it with the user); a missing group would
		// keep gpuhost.service from starting at all.
		if !bc.Adopt && !bc.Simulated && bc.User == units.DefaultBackendUser && !slices.Contains(d.BackendGroups, bc.User) {
			d.BackendGroups = append(d.BackendGroups, bc.User)
		}
	}
	if c.StateDir != DefaultStateDir {
		d.ReadWritePaths = append(d.ReadWritePaths, c.StateDir)
	}
	if c.Systemd.UnitDir != DefaultUnitDir {
		d.ReadWritePaths = append(d.ReadWritePaths, c.Systemd.UnitDir)
	}
	if c.GPU.Backend == "sim" && !strings.HasPrefix(c.GPU.SimDir+"/", c.StateDir+"/") {
		// gpuhost creates the simulated GPU's folder and reads its claims.
		d.ReadWritePaths = append(d.ReadWritePaths, c.GPU.SimDir)
	}
	return d
}

// EnvFilePath is where gpuhost writes the per-switch environment of a unit.
func (c *Config) EnvFilePath(unit string) string {
	return filepath.Join(c.StateDir, "backends", strings.TrimSuffix(unit, ".service")+".env")
}

// Path is the file the config was loaded from.
func (c *Config) Path() string { return c.path }

// IsLoopback reports whether the listen address only accepts local clients.
// A wildcard host (0.0.0.0, [::], ":8080") binds every interface and is
// not loopback.
func (c *Config) IsLoopback() bool { return loopback.ListensOnly(c.Listen) }

// APIToken reads the bearer token at call time (never cached in logs). It
// returns "" with no error when none is configured.
func (c *Config) APIToken() (string, error) {
	if c.APITokenFile != "" {
		b, err := os.ReadFile(c.APITokenFile)
		if err != nil {
			return "", fmt.Errorf("read api_token_file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return strings.TrimSpace(os.Getenv(c.APITokenEnv)), nil
}

func ptr[T any](v T) *T { return &v }

// checkHTTPURL reports v under key unless it is empty or an http(s) URL
// with a host.
func checkHTTPURL(add func(key, format string, args ...any), key, v string) {
	if v == "" {
		return
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add(key, "%q is not an http(s) URL", v)
	}
}
