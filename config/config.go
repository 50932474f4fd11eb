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
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

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
	Listen      string `yaml:"listen"`
	StateDir    string `yaml:"state_dir"`
	APITokenEnv string `yaml:"api_token_env"`
	// APITokenFile is read at start; it wins over APITokenEnv when both are set.
	APITokenFile   string                    `yaml:"api_token_file"`
	GPU            GPUConfig                 `yaml:"gpu"`
	Systemd        SystemdConfig             `yaml:"systemd"`
	Backends       BackendsConfig            `yaml:"backends"`
	Switch         SwitchConfig              `yaml:"switch"`
	DefaultProfile string                    `yaml:"default_profile"`
	Policy         *units.Policy             `yaml:"policy"`
	Profiles       map[string]*units.Profile `yaml:"profiles"`
	Proxy          ProxyConfig               `yaml:"proxy"`
	Panel          PanelConfig               `yaml:"panel"`
	Telegram       TelegramConfig            `yaml:"telegram"`
	Metrics        MetricsConfig             `yaml:"metrics"`
	MCP            MCPConfig                 `yaml:"mcp"`
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
}

// GPUConfig selects the GPU facts source and the VRAM-release rules.
type GPUConfig struct {
	Backend string `yaml:"backend"` // nvml | sim
	SimDir  string `yaml:"sim_dir"`
	// IdleBaselineMiB is the used memory with no backend running; 0 means
	// "measure it at start-up when no backend runs".
	IdleBaselineMiB uint64 `yaml:"idle_baseline_mib"`
	// ReleaseToleranceMiB is how far above the baseline used memory may stay
	// and still count as released (drivers keep a little for contexts).
	ReleaseToleranceMiB uint64   `yaml:"release_tolerance_mib"`
	ReleaseTimeout      Duration `yaml:"release_timeout"`
	// StandbyWatchInterval is how often the Supervisor checks that every
	// backend in standby holds no more than its measured residual.
	StandbyWatchInterval Duration `yaml:"standby_watch_interval"`
}

// SystemdConfig says how to reach systemd and where unit files go.
type SystemdConfig struct {
	// Socket empty means the system bus; otherwise a private systemd socket
	// such as /run/systemd/private (used by the tests' private systemd).
	Socket  string `yaml:"socket"`
	UnitDir string `yaml:"unit_dir"`
	// Runner "systemd" (default) or "process" (the demo's in-process runner).
	Runner string `yaml:"runner"`
}

// BackendsConfig names the two backend units. Exactly these two kinds exist.
type BackendsConfig struct {
	VLLM   BackendConfig `yaml:"vllm"`
	Ollama BackendConfig `yaml:"ollama"`
}

// BackendConfig is one backend unit: rendered by gpuhost or adopted.
type BackendConfig struct {
	Unit  string   `yaml:"unit"`
	Adopt bool     `yaml:"adopt"`
	Exec  []string `yaml:"exec"`
	// Simulated marks Exec as `gpuhost simulate …`: the profile's sim options
	// are appended to the arguments.
	Simulated bool `yaml:"simulated"`
	// User runs the backend; default units.DefaultBackendUser (created by
	// scripts/install.sh). "root" is allowed but opts out of that.
	User string `yaml:"user"`
	// ReadWritePaths are the folders the backend may write under the unit's
	// ProtectSystem=strict: model caches and model folders. Default: the
	// default backend user's home, units.DefaultBackendHome, which holds
	// ~/.cache/huggingface, ~/.cache/vllm and ~/.ollama.
	ReadWritePaths []string `yaml:"read_write_paths"`
}

// SwitchConfig tunes the switch state machine.
type SwitchConfig struct {
	ReadyTimeout Duration `yaml:"ready_timeout"`
	StopTimeout  Duration `yaml:"stop_timeout"`
	// Rollback to the previous profile when the new one fails to start.
	Rollback *bool `yaml:"rollback"`
	// RestoreOnBoot switches to the last wanted profile when the daemon
	// starts and no backend runs.
	RestoreOnBoot *bool `yaml:"restore_on_boot"`
}

// ProxyConfig tunes the OpenAI-compatible /v1 endpoint.
type ProxyConfig struct {
	Disabled bool `yaml:"disabled"`
	// AutoSwitch lets a request for another profile's model trigger a
	// switch (and be held until it is done); off, such a request gets 404.
	AutoSwitch bool `yaml:"auto_switch"`
	// HoldTimeout is how long a request is held during a switch before it
	// gets 503 with Retry-After.
	HoldTimeout  Duration `yaml:"hold_timeout"`
	MaxBodyBytes int64    `yaml:"max_body_bytes"`
	// BodyMemoryBytes is the memory all request bodies the proxy holds at
	// once may take (bodies are read whole to route them and to hold them
	// during a switch); beyond it a request gets 503 with Retry-After.
	BodyMemoryBytes int64 `yaml:"body_memory_bytes"`
	// DrainTimeout (auto_switch) is how long a switch away from the
	// current model waits for the requests running on it to finish; after
	// it the switch goes ahead and cuts them. Default 30s (or hold_timeout
	// when that is shorter); 0 = no drain.
	DrainTimeout *Duration `yaml:"drain_timeout"`
	// MinResidency (auto_switch) keeps a model that is in use loaded at
	// least this long after it became active and after its latest request:
	// requests for another model are held meanwhile (never failed for it;
	// see frontdoor/proxy). Default 10s (or hold_timeout when that is
	// shorter); 0 = switch at once.
	MinResidency *Duration `yaml:"min_residency"`
}

// Default proxy.drain_timeout and proxy.min_residency.
const (
	DefaultDrainTimeout = 30 * time.Second
	DefaultMinResidency = 10 * time.Second
)

// PanelConfig controls the web panel.
type PanelConfig struct {
	Disabled bool `yaml:"disabled"`
}

// TelegramConfig controls the Telegram bot. The token is read at start from
// TokenFile or the environment variable TokenEnv, never from this file.
type TelegramConfig struct {
	Enabled   bool   `yaml:"enabled"`
	TokenEnv  string `yaml:"token_env"`
	TokenFile string `yaml:"token_file"`
	// APIURL is the Bot API server (tests point it at a fake).
	APIURL      string `yaml:"api_url"`
	AllowGroups bool   `yaml:"allow_groups"`
}

// MCPConfig controls the MCP server. A connector is enabled when its
// section exists under connectors (an empty mapping enables it with its
// defaults); each connector decodes and validates its own section.
type MCPConfig struct {
	// Disabled turns off the daemon's /mcp mount (stdio `gpuhost mcp` still works).
	Disabled bool `yaml:"disabled"`
	// ConnectorsDir holds declarative connectors (*.yaml), read at start
	// and on SIGHUP.
	ConnectorsDir string               `yaml:"connectors_dir"`
	Connectors    map[string]yaml.Node `yaml:"connectors"`
}

// MetricsConfig controls the Prometheus endpoint.
type MetricsConfig struct {
	Disabled bool `yaml:"disabled"`
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

// Load reads, decodes, defaults and validates a config file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
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
	c.proxyDefaults()
	c.httpDefaults()
	c.mcpDefaults()
	c.telegramDefaults()
	c.profilesDefaults()
}

// mcpDefaults fills in the mcp: section.
func (c *Config) mcpDefaults() {
	if c.MCP.ConnectorsDir == "" {
		c.MCP.ConnectorsDir = "/etc/gpuhost/connectors.d"
	}
}

// telegramDefaults fills in the telegram: section.
func (c *Config) telegramDefaults() {
	if c.Telegram.TokenEnv == "" {
		c.Telegram.TokenEnv = "GPUHOST_TELEGRAM_TOKEN"
	}
	if c.Telegram.APIURL == "" {
		c.Telegram.APIURL = "https://api.telegram.org"
	}
}

// profilesDefaults fills in the policy: the profiles share, and each
// profile's name and served name.
func (c *Config) profilesDefaults() {
	if c.Policy == nil {
		p := units.DefaultPolicy()
		c.Policy = &p
	}
	for name, p := range c.Profiles {
		if p == nil {
			continue
		}
		p.Name = name
		if p.ServedName == "" {
			p.ServedName = p.Model
		}
	}
}

// gpuDefaults fills in the gpu: section (sim_dir is below state_dir, whose
// default is set first).
func (c *Config) gpuDefaults() {
	if c.GPU.Backend == "" {
		c.GPU.Backend = "nvml"
	}
	if c.GPU.SimDir == "" {
		c.GPU.SimDir = filepath.Join(c.StateDir, "simgpu")
	}
	if c.GPU.ReleaseToleranceMiB == 0 {
		c.GPU.ReleaseToleranceMiB = 512
	}
	if c.GPU.StandbyWatchInterval == 0 {
		c.GPU.StandbyWatchInterval = Duration(2 * time.Second)
	}
	if c.GPU.ReleaseTimeout == 0 {
		c.GPU.ReleaseTimeout = Duration(60 * time.Second)
	}
}

// systemdDefaults fills in the systemd: section.
func (c *Config) systemdDefaults() {
	if c.Systemd.UnitDir == "" {
		c.Systemd.UnitDir = DefaultUnitDir
	}
	if c.Systemd.Runner == "" {
		c.Systemd.Runner = "systemd"
	}
}

// backendsDefaults fills in the backends: section.
func (c *Config) backendsDefaults() {
	if c.Backends.VLLM.Unit == "" {
		c.Backends.VLLM.Unit = "gpuhost-vllm.service"
	}
	if c.Backends.Ollama.Unit == "" {
		c.Backends.Ollama.Unit = "gpuhost-ollama.service"
	}
	for _, b := range []*BackendConfig{&c.Backends.VLLM, &c.Backends.Ollama} {
		if b.User == "" {
			b.User = units.DefaultBackendUser
		}
		if b.ReadWritePaths == nil {
			b.ReadWritePaths = []string{units.DefaultBackendHome}
		}
	}
	if len(c.Backends.VLLM.Exec) == 0 {
		c.Backends.VLLM.Exec = []string{"/usr/local/bin/vllm"}
	}
	if len(c.Backends.Ollama.Exec) == 0 {
		c.Backends.Ollama.Exec = []string{"/usr/local/bin/ollama"}
	}
}

// switchDefaults fills in the switch: section.
func (c *Config) switchDefaults() {
	if c.Switch.ReadyTimeout == 0 {
		c.Switch.ReadyTimeout = Duration(15 * time.Minute)
	}
	if c.Switch.StopTimeout == 0 {
		c.Switch.StopTimeout = Duration(90 * time.Second)
	}
	if c.Switch.Rollback == nil {
		c.Switch.Rollback = ptr(true)
	}
	if c.Switch.RestoreOnBoot == nil {
		c.Switch.RestoreOnBoot = ptr(true)
	}
}

// proxyDefaults fills in the proxy: section, but for body_memory_bytes
// (httpDefaults).
func (c *Config) proxyDefaults() {
	if c.Proxy.HoldTimeout == 0 {
		c.Proxy.HoldTimeout = Duration(10 * time.Minute)
	}
	if c.Proxy.MaxBodyBytes == 0 {
		c.Proxy.MaxBodyBytes = 32 << 20
	}
	// Unset, the policy's bounds follow a shorter hold_timeout down.
	if c.Proxy.DrainTimeout == nil {
		c.Proxy.DrainTimeout = ptr(min(Duration(DefaultDrainTimeout), c.Proxy.HoldTimeout))
	}
	if c.Proxy.MinResidency == nil {
		c.Proxy.MinResidency = ptr(min(Duration(DefaultMinResidency), c.Proxy.HoldTimeout))
	}
}

var profileNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

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
	c.proxyValidate(add)
	c.telegramValidate(add)
	c.switchValidate(add)
	c.triageValidate(add)
	c.agentValidate(add)
	c.httpValidate(add)
	return ps
}

// proxyValidate checks the proxy: section, but for body_memory_bytes
// (httpValidate).
func (c *Config) proxyValidate(add func(key, format string, args ...any)) {
	if c.Proxy.MaxBodyBytes < 1024 {
		add("proxy.max_body_bytes", "%d is too small (at least 1024)", c.Proxy.MaxBodyBytes)
	}
	// The policy's waits are not charged to hold_timeout (a request is
	// never failed for them), so each is bounded by it instead.
	if d := c.Proxy.DrainTimeout.D(); d > c.Proxy.HoldTimeout.D() {
		add("proxy.drain_timeout", "%s is longer than proxy.hold_timeout (%s): a request for another model would wait longer for the drain than any request is held for a switch", d, c.Proxy.HoldTimeout.D())
	}
	if d := c.Proxy.MinResidency.D(); d > c.Proxy.HoldTimeout.D() {
		add("proxy.min_residency", "%s is longer than proxy.hold_timeout (%s): a request for another model would wait longer for the residency than any request is held for a switch", d, c.Proxy.HoldTimeout.D())
	}
}

// telegramValidate checks the telegram: section.
func (c *Config) telegramValidate(add func(key, format string, args ...any)) {
	if c.Telegram.APIURL != "" {
		if msg := checkBotAPIURL(c.Telegram.APIURL); msg != "" {
			add("telegram.api_url", "%s", msg)
		}
	}
}

// switchValidate checks the switch: section.
func (c *Config) switchValidate(add func(key, format string, args ...any)) {
	if c.Switch.ReadyTimeout.D() < time.Second {
		add("switch.ready_timeout", "%s is too short (at least 1s)", c.Switch.ReadyTimeout.D())
	}
}

// gpuValidate checks the gpu: section.
func (c *Config) gpuValidate(add func(key, format string, args ...any)) {
	switch c.GPU.Backend {
	case "nvml", "sim":
	default:
		add("gpu.backend", "%q is not one of nvml, sim", c.GPU.Backend)
	}
	if c.GPU.Backend == "sim" {
		if err := unitPath(c.GPU.SimDir); err != nil {
			add("gpu.sim_dir", "%v", err)
		}
	}
}

// systemdValidate checks the systemd: section.
func (c *Config) systemdValidate(add func(key, format string, args ...any)) {
	switch c.Systemd.Runner {
	case "systemd", "process":
	default:
		add("systemd.runner", "%q is not one of systemd, process", c.Systemd.Runner)
	}
	if c.Systemd.Socket != "" && !filepath.IsAbs(c.Systemd.Socket) {
		add("systemd.socket", "%q must be an absolute path", c.Systemd.Socket)
	}
	if err := unitPath(c.Systemd.UnitDir); err != nil {
		add("systemd.unit_dir", "%v", err)
	}
}

// backendsValidate checks the backends: section. clean says no problem was
// found before it: only then, and when the backends themselves passed, the
// unit renderer's own check runs too.
func (c *Config) backendsValidate(add func(key, format string, args ...any), clean bool) {
	problems := 0
	count := func(key, format string, args ...any) {
		problems++
		add(key, format, args...)
	}
	for _, b := range []struct {
		key string
		cfg BackendConfig
	}{{"backends.vllm", c.Backends.VLLM}, {"backends.ollama", c.Backends.Ollama}} {
		if err := units.ValidServiceName(b.cfg.Unit); err != nil {
			count(b.key+".unit", "%v", err)
		}
		if b.cfg.User != "" {
			if err := units.ValidUser(b.cfg.User); err != nil {
				count(b.key+".user", "%v", err)
			}
		}
		if !filepath.IsAbs(b.cfg.Exec[0]) {
			count(b.key+".exec[0]", "%q must be an absolute path (systemd runs it without a shell)", b.cfg.Exec[0])
		}
		for i, w := range b.cfg.Exec {
			if err := unitValue(w); err != nil {
				count(fmt.Sprintf("%s.exec[%d]", b.key, i), "%v", err)
			}
		}
		for i, p := range b.cfg.ReadWritePaths {
			if err := unitPath(p); err != nil {
				count(fmt.Sprintf("%s.read_write_paths[%d]", b.key, i), "%v", err)
			}
		}
	}
	if c.Backends.VLLM.Unit == c.Backends.Ollama.Unit {
		add("backends.ollama.unit", "%q is the same unit as backends.vllm.unit", c.Backends.Ollama.Unit)
	} else if clean && problems == 0 {
		// The renderer's own check, as `gpuhost units` runs it: anything it
		// refuses that the checks above let through is still a load error.
		for i, bu := range c.BackendUnits() {
			if err := bu.Validate(); err != nil {
				add([]string{"backends.vllm", "backends.ollama"}[i], "%v", err)
			}
		}
	}
}

// profilesValidate checks profiles: (names and each profile, in name
// order), their aliases, and default_profile.
func (c *Config) profilesValidate(add func(key, format string, args ...any)) {
	if len(c.Profiles) == 0 {
		add("profiles", "at least one profile is needed")
	}
	names := make([]string, 0, len(c.Profiles))
	for name := range c.Profiles {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := c.Profiles[name]
		key := "profiles." + name
		if p == nil {
			add(key, "profile is empty")
			continue
		}
		if !profileNameRE.MatchString(name) {
			add(key, "profile name must be lower-case letters, digits, '.', '_' or '-' (max 63)")
		}
		for _, fe := range p.Validate() {
			add(key+"."+fe.Key, "%s", fe.Msg)
		}
	}
	c.checkAliases(add, names)
	if c.DefaultProfile != "" {
		if _, ok := c.Profiles[c.DefaultProfile]; !ok {
			add("default_profile", "%q is not a profile (profiles: %s)", c.DefaultProfile, strings.Join(names, ", "))
		}
	}
}

// checkBotAPIURL returns why raw is not an acceptable Bot API server URL, or
// "". The bot puts its token in every request path, so the URL is parsed,
// not matched by prefix: https to any host, plain http only to a loopback IP
// literal (127.0.0.0/8, ::1) or "localhost" (a fake API in tests), and never
// user info, a query or a fragment, which would make the host read
// differently to a person and to the HTTP client.
func checkBotAPIURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Sprintf("%q is not a URL: %v", raw, err)
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return fmt.Sprintf("%q must be an https:// URL (plain http only to a loopback address, for tests)", raw)
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("%q has no host", raw)
	case u.User != nil:
		return fmt.Sprintf("%q must not carry user info (user@host): the bot token would go to the host after the @", raw)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Sprintf("%q must not have a query or fragment", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("%q has an invalid port %q", raw, p)
		}
	}
	if u.Scheme == "http" {
		host := u.Hostname()
		ip := net.ParseIP(host)
		if !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			return fmt.Sprintf("%q must be https: plain http is allowed only to a loopback IP address or localhost (for tests), not %q", raw, host)
		}
	}
	return ""
}

// checkAliases refuses a model name that would resolve to two profiles or be
// listed twice by /v1/models: an alias equal to a served name (its own
// profile's or another's), or one alias in two profiles.
func (c *Config) checkAliases(add func(key, format string, args ...any), names []string) {
	served := map[string]string{} // served name → first profile serving it
	for _, name := range names {
		if p := c.Profiles[name]; p != nil {
			if _, ok := served[p.ServedModelName()]; !ok {
				served[p.ServedModelName()] = name
			}
		}
	}
	aliasOf := map[string]string{}
	for _, name := range names {
		p := c.Profiles[name]
		if p == nil {
			continue
		}
		for i, a := range p.Aliases {
			key := fmt.Sprintf("profiles.%s.aliases[%d]", name, i)
			if owner, ok := served[a]; ok {
				if owner == name {
					add(key, "%q is this profile's own served name; remove the alias", a)
				} else {
					add(key, "%q is the served name of profile %q; an alias must not name another profile's model", a, owner)
				}
				continue
			}
			if owner, ok := aliasOf[a]; ok {
				add(key, "%q is already an alias of profile %q", a, owner)
				continue
			}
			aliasOf[a] = name
		}
	}
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

// ProfileNames returns the profile names sorted, for messages and listings.
func (c *Config) ProfileNames() []string {
	names := make([]string, 0, len(c.Profiles))
	for n := range c.Profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// BackendFor returns the backend unit config of a backend kind.
func (c *Config) BackendFor(b units.Backend) BackendConfig {
	if b == units.Ollama {
		return c.Backends.Ollama
	}
	return c.Backends.VLLM
}

// BackendUnits returns the two backend units in a fixed order (vllm, ollama)
// as the pure units package describes them.
func (c *Config) BackendUnits() []units.BackendUnit {
	standby := c.StandbyUsed()
	mk := func(b units.Backend, bc BackendConfig, other string) units.BackendUnit {
		u := units.BackendUnit{
			Backend: b,
			Name:    bc.Unit,
			Adopt:   bc.Adopt,
			Exec:    bc.Exec,
			EnvFile: c.EnvFilePath(bc.Unit),
			User:    bc.User,
			Standby: standby,
		}
		if !standby {
			u.Conflicts = []string{other}
		}
		u.ReadWritePaths = append(u.ReadWritePaths, bc.ReadWritePaths...)
		if bc.Simulated && c.GPU.Backend == "sim" {
			// `gpuhost simulate` writes the simulated GPU's state there.
			u.ReadWritePaths = append(u.ReadWritePaths, c.GPU.SimDir)
		}
		return u
	}
	return []units.BackendUnit{
		mk(units.VLLM, c.Backends.VLLM, c.Backends.Ollama.Unit),
		mk(units.Ollama, c.Backends.Ollama, c.Backends.VLLM.Unit),
	}
}

// DefaultStateDir is state_dir's default, the folder gpuhost.service's
// StateDirectory=gpuhost makes writable.
const DefaultStateDir = "/var/lib/gpuhost"

// DefaultUnitDir is systemd.unit_dir's default.
const DefaultUnitDir = "/etc/systemd/system"

// StandbyUsed reports whether any profile uses standby: both backend
// units may then run at once (one asleep), so they must not conflict.
func (c *Config) StandbyUsed() bool {
	for _, p := range c.Profiles {
		if p != nil && p.StandbyEnabled() {
			return true
		}
	}
	return false
}

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
