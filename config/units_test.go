package config

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"

	"gopkg.in/yaml.v3"

	"gpuhost/units"
)

// unitsBase is a config in which every setting that can reach a rendered
// file does: simulated vLLM and Ollama backends with a user and writable
// folders, and profiles that fill every field of the environment file.
const unitsBase = `
listen: 127.0.0.1:8080
state_dir: /srv/gpuhost
gpu: {backend: sim, sim_dir: /srv/gpuhost/simgpu}
systemd: {unit_dir: /etc/systemd/system}
backends:
  vllm:
    unit: gpuhost-vllm.service
    exec: [/usr/local/bin/gpuhost, simulate, vllm, --sim-dir, /srv/gpuhost/simgpu]
    simulated: true
    user: gpuhost-backend
    read_write_paths: [/srv/models]
  ollama:
    unit: gpuhost-ollama.service
    exec: [/usr/local/bin/gpuhost, simulate, ollama]
    simulated: true
    user: gpuhost-backend
    read_write_paths: [/srv/ollama]
profiles:
  v:
    backend: vllm
    model: org/model
    served_name: served
    aliases: [alias]
    port: 8000
    vllm: {tool_call_parser: hermes, quantization: awq, kv_cache_dtype: fp8, extra_args: [--enable-prefix-caching]}
    sim: {load_time: 1s}
  o:
    backend: ollama
    model: llama3.1:8b
    port: 11434
    ollama: {keep_alive: 5m}
`

// configLeaves lists the yaml key path of every string (or first []string
// element) a config can hold, by reflection over Config: a field added
// later is walked without anyone updating a list. Map-valued sections are
// entered through the keys that base gives them (the profiles "v" and "o").
func configLeaves(t reflect.Type, path string, mapKeys []string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(yaml.Node{}) {
		return // decoded and checked by its owner (mcp connectors)
	}
	switch t.Kind() {
	case reflect.String:
		*out = append(*out, path)
	case reflect.Slice:
		configLeaves(t.Elem(), path+"[0]", mapKeys, out)
	case reflect.Map:
		for _, k := range mapKeys {
			configLeaves(t.Elem(), joinKey(path, k), nil, out)
		}
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if tag == "" || tag == "-" || !f.IsExported() {
				continue
			}
			configLeaves(f.Type, joinKey(path, tag), mapKeys, out)
		}
	}
}

// setLeaf sets path (a.b[0].c) in a generic YAML document to v, creating
// mappings and one-element sequences as needed, and returns the old value.
func setLeaf(doc map[string]any, path string, v string) string {
	parts := strings.Split(path, ".")
	var cur any = doc
	for i, p := range parts {
		last := i == len(parts)-1
		name, idx := p, false
		if strings.HasSuffix(p, "[0]") {
			name, idx = strings.TrimSuffix(p, "[0]"), true
		}
		m := cur.(map[string]any)
		if idx {
			seq, _ := m[name].([]any)
			if len(seq) == 0 {
				seq = []any{nil}
			}
			m[name] = seq
			if last {
				old, _ := seq[0].(string)
				seq[0] = v
				return old
			}
			if _, ok := seq[0].(map[string]any); !ok {
				seq[0] = map[string]any{}
			}
			cur = seq[0]
			continue
		}
		if last {
			old, _ := m[name].(string)
			m[name] = v
			return old
		}
		if _, ok := m[name].(map[string]any); !ok {
			m[name] = map[string]any{}
		}
		cur = m[name]
	}
	return ""
}

// renderAll is every file gpuhost writes from a config for systemd:
// gpuhost.service, the backend units, and each profile's environment file.
func renderAll(c *Config) map[string]string {
	files := map[string]string{"gpuhost.service": units.RenderDaemonUnit(c.DaemonUnit("/usr/local/bin/gpuhost", "/etc/gpuhost/gpuhost.yaml"))}
	for _, bu := range c.BackendUnits() {
		files[bu.Name] = units.RenderBackendUnit(bu)
		_, files[bu.Name+".d/"+units.DropInName] = units.RenderAdoptDropIn(bu)
		for _, f := range units.RenderProxyUnits(bu) {
			files[f.Name] = f.Content
		}
	}
	for name, p := range c.Profiles {
		files["env:"+name] = units.EnvFile(*p, c.BackendFor(p.Backend).Simulated)
	}
	return files
}

// TestControlCharactersNeverReachUnitFiles walks every string setting of the
// config. A setting that reaches a rendered unit or environment file (its
// value shows up there) must refuse a control character at load, naming
// its key and line; no setting may ever put one, or an injected line, into
// a rendered file.
func TestControlCharactersNeverReachUnitFiles(t *testing.T) {
	var leaves []string
	configLeaves(reflect.TypeOf(Config{}), "", []string{"v", "o"}, &leaves)
	sort.Strings(leaves)
	if len(leaves) < 50 {
		t.Fatalf("only %d settings found by reflection: %v", len(leaves), leaves)
	}
	parse := func(path, value string) (*Config, error) {
		t.Helper()
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(unitsBase), &doc); err != nil {
			t.Fatal(err)
		}
		setLeaf(doc, path, value)
		data, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		return Parse("units.yaml", data)
	}
	base, err := Parse("units.yaml", []byte(unitsBase))
	if err != nil {
		t.Fatalf("base config: %v", err)
	}
	baseFiles := renderAll(base)

	var reaching []string
	for _, leaf := range leaves {
		var doc map[string]any
		_ = yaml.Unmarshal([]byte(unitsBase), &doc)
		orig := setLeaf(doc, leaf, "")
		if orig == "" {
			orig = "/x"
		}
		// A harmless marker inserted after the first character keeps the
		// value's shape (absolute paths stay absolute, names stay names).
		const marker = "zq7mark"
		benign := orig[:1] + marker + orig[1:]
		reaches := false
		if c, err := parse(leaf, benign); err == nil {
			for _, text := range renderAll(c) {
				if strings.Contains(text, marker) {
					reaches = true
				}
			}
		}
		if reaches {
			reaching = append(reaching, leaf)
		}
		for _, inject := range []string{"\nExecStartPre=/bin/sh -c evil\n", "\rUser=root", "\x1b[2J", "\u0085", "\t"} {
			bad := orig[:1] + inject + orig[1:]
			c, err := parse(leaf, bad)
			if err != nil {
				if reaches && !strings.Contains(err.Error(), leaf+" (line ") {
					t.Errorf("%s = %q: error does not name the key and its line: %v", leaf, bad, err)
				}
				continue
			}
			if reaches {
				t.Errorf("%s = %q: accepted, and the setting reaches a unit or environment file", leaf, bad)
			}
			for name, text := range renderAll(c) {
				if text == baseFiles[name] {
					continue
				}
				for _, line := range strings.Split(text, "\n") {
					if strings.ContainsFunc(line, unicode.IsControl) || strings.HasPrefix(line, "ExecStartPre=") || strings.HasPrefix(line, "User=root") {
						t.Errorf("%s = %q: %s has the line %q", leaf, bad, name, line)
					}
				}
			}
		}
	}
	// The walk must see the settings the issue found injectable, and the
	// rest that reach a file; otherwise it proves nothing. (ollama.keep_alive
	// and sim.load_time reach the environment file too, but only as valid
	// durations, and vllm.tool_call_parser only as one of vLLM's parser
	// names, so no marker gets through them.)
	for _, want := range []string{
		"state_dir", "backends.vllm.unit", "backends.vllm.user", "backends.vllm.exec[0]", "backends.vllm.read_write_paths[0]",
		"backends.ollama.unit", "backends.ollama.user", "gpu.sim_dir", "profiles.v.model", "profiles.v.served_name",
		"profiles.v.vllm.extra_args[0]", "systemd.unit_dir",
	} {
		if !slices.Contains(reaching, want) {
			t.Errorf("%s was not seen to reach a rendered file; settings that do: %v", want, reaching)
		}
	}
	t.Logf("%d settings walked; %d reach a rendered file: %s", len(leaves), len(reaching), fmt.Sprint(reaching))
}

// TestUnitValuesRefusedWithLine is the probe: a newline in
// backends.*.unit, backends.*.user or state_dir used to load and render an
// injected line. Each is refused now, with its key and line.
func TestUnitValuesRefusedWithLine(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"newline in unit", minimal + "backends:\n  vllm:\n    unit: \"x.service\\nExecStartPre=/bin/evil\"\n", "backends.vllm.unit (line 10)"},
		{"newline in user", minimal + "backends:\n  ollama:\n    user: \"nobody\\nUser=root\"\n", "backends.ollama.user (line 10)"},
		{"newline in state_dir", strings.Replace(minimal, "state_dir: /var/lib/gpuhost", "state_dir: \"/var/lib/x\\nExecStartPre=/bin/evil\"", 1), "state_dir (line 2)"},
		{"relative state_dir", strings.Replace(minimal, "state_dir: /var/lib/gpuhost", "state_dir: var/lib", 1), "state_dir (line 2)"},
		{"unclean state_dir", strings.Replace(minimal, "state_dir: /var/lib/gpuhost", "state_dir: /var/lib/../gpuhost/", 1), "state_dir (line 2)"},
		{"state_dir with a space", strings.Replace(minimal, "state_dir: /var/lib/gpuhost", "state_dir: /var/lib/gpu host", 1), "state_dir (line 2)"},
		{"user not useradd-style", minimal + "backends:\n  vllm:\n    user: Root\n", "backends.vllm.user (line 10)"},
		{"unit name with a slash", minimal + "backends:\n  vllm:\n    unit: a/b.service\n", "backends.vllm.unit (line 10)"},
		{"template unit", minimal + "backends:\n  vllm:\n    unit: vllm@.service\n", "backends.vllm.unit (line 10)"},
		{"exec with a newline", minimal + "backends:\n  vllm:\n    exec: [/usr/bin/vllm, \"a\\nb\"]\n", "backends.vllm.exec[1] (line 10)"},
		{"relative writable path", minimal + "backends:\n  vllm:\n    read_write_paths: [models]\n", "backends.vllm.read_write_paths[0] (line 10)"},
		{"value error in a profile", strings.Replace(minimal, "port: 8000", "port: 70000", 1), "profiles.p1.port (line 7)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// TestAliasClashes: an alias that is another profile's served name made
// /v1/models list the name twice and routing ambiguous.
func TestAliasClashes(t *testing.T) {
	two := minimal + "  p2:\n    backend: ollama\n    model: llama3.1:8b\n    port: 11434\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"alias is another profile's served name", strings.Replace(two, "port: 11434", "port: 11434\n    aliases: [org/model]", 1), `profiles.p2.aliases[0] (line 12): "org/model" is the served name of profile "p1"`},
		{"alias is its own served name", strings.Replace(two, "port: 8000", "port: 8000\n    aliases: [org/model]", 1), `profiles.p1.aliases[0] (line 8): "org/model" is this profile's own served name`},
		{"one alias in two profiles", strings.Replace(strings.Replace(two, "port: 8000", "port: 8000\n    aliases: [fast]", 1), "port: 11434", "port: 11434\n    aliases: [fast]", 1), `profiles.p2.aliases[0] (line 13): "fast" is already an alias of profile "p1"`},
		{"one served name for two models", strings.Replace(two, "port: 11434", "port: 11434\n    served_name: org/model", 1), `profiles.p2.served_name (line 12): "org/model" is also the served name of profile "p1", which runs another model (vllm org/model)`},
		{"a served name a client would expand", strings.Replace(two, "port: 11434", "port: 11434\n    served_name: \"{env:HOME}\"", 1), `profiles.p2.served_name (line 12)`},
		{"alias with a control character", strings.Replace(two, "port: 11434", "port: 11434\n    aliases: [\"a\\rb\"]", 1), `profiles.p2.aliases[0] (line 12)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := Parse("test.yaml", []byte(strings.Replace(two, "port: 11434", "port: 11434\n    aliases: [llama]", 1))); err != nil {
		t.Errorf("a distinct alias is refused: %v", err)
	}
	variant := two + "  p3:\n    backend: vllm\n    model: org/model\n    port: 8001\n    vllm: {max_num_seqs: 4}\n"
	if _, err := Parse("test.yaml", []byte(variant)); err != nil {
		t.Errorf("a variant of one model under its served name is refused: %v", err)
	}
}

// TestDaemonUnitWritesStateDir: under ProtectSystem=strict a state_dir other
// than /var/lib/gpuhost was read-only and every switch failed at
// "configure"; it is now in gpuhost.service's ReadWritePaths=.
func TestDaemonUnitWritesStateDir(t *testing.T) {
	for _, tc := range []struct {
		yaml   string
		wantRW string
	}{
		{minimal, "ReadWritePaths=/etc/systemd/system -/run/systemd/system\n"},
		{strings.Replace(minimal, "/var/lib/gpuhost", "/srv/gpuhost", 1), "ReadWritePaths=/etc/systemd/system -/run/systemd/system /srv/gpuhost\n"},
		{minimal + "systemd: {unit_dir: /run/systemd/system}\n", "ReadWritePaths=/etc/systemd/system -/run/systemd/system /run/systemd/system\n"},
		{minimal + "gpu: {backend: sim}\n", "ReadWritePaths=/etc/systemd/system -/run/systemd/system\n"},
		{minimal + "gpu: {backend: sim, sim_dir: /srv/sim}\n", "ReadWritePaths=/etc/systemd/system -/run/systemd/system /srv/sim\n"},
	} {
		c, err := Parse("test.yaml", []byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		text := units.RenderDaemonUnit(c.DaemonUnit("/usr/local/bin/gpuhost", "/etc/gpuhost/gpuhost.yaml"))
		if !strings.Contains(text, "\n"+tc.wantRW) {
			t.Errorf("state_dir %s: want %q in\n%s", c.StateDir, tc.wantRW, text)
		}
	}
}

// TestBackendSockets: under systemd every profile port maps to its
// backend's socket (the dialer's table), none under the process runner or
// for an adopted unit; a port both backends use is refused by name.
func TestBackendSockets(t *testing.T) {
	c, err := Parse("units.yaml", []byte(unitsBase))
	if err != nil {
		t.Fatal(err)
	}
	got := c.BackendSockets()
	if len(got) == 0 {
		t.Fatal("no sockets under the systemd runner")
	}
	for _, p := range c.Profiles {
		want := units.ProxySocketPath(c.BackendFor(p.Backend).Unit, p.Port)
		if got[p.Port] != want {
			t.Errorf("profile %s port %d: socket %q, want %q", p.Name, p.Port, got[p.Port], want)
		}
	}
	if d := c.DaemonUnit("/b", "/c"); len(d.Sockets) == 0 {
		t.Error("gpuhost.service wants no socket units")
	}
	c.Systemd.Runner = "process"
	if s := c.BackendSockets(); s != nil {
		t.Errorf("process runner: sockets %v, want none", s)
	}
	c.Systemd.Runner = "systemd"
	c.Backends.VLLM.Adopt = true
	for _, p := range c.Profiles {
		if _, ok := c.BackendSockets()[p.Port]; ok && p.Backend == units.VLLM {
			t.Errorf("adopted vLLM unit: port %d still mapped to a socket", p.Port)
		}
	}
	_, err = Parse("shared.yaml", []byte(strings.Replace(unitsBase, "port: 11434", "port: 8000", 1)))
	if err == nil || !strings.Contains(err.Error(), "port 8000 is used by a vllm and an ollama profile") {
		t.Errorf("a port shared by both backends: %v, want it refused by number", err)
	}
	if _, err := Parse("shared-demo.yaml", []byte(strings.Replace(strings.Replace(unitsBase, "port: 11434", "port: 8000", 1),
		"systemd: {unit_dir: /etc/systemd/system}", "systemd: {unit_dir: /etc/systemd/system, runner: process}", 1))); err != nil {
		t.Errorf("a shared port under the process runner: %v, want no socket check", err)
	}
}

// TestNetworkOpening: a profile opts out of the offline settings only with
// its backend's unit open, and only that unit loses its fence.
func TestNetworkOpening(t *testing.T) {
	y := minimal + "    network: open\nbackends:\n  vllm:\n    network: open\n"
	cfg, err := Parse("test.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Profiles["p1"].Offline() {
		t.Error("profile p1 with network: open is still offline")
	}
	got := map[units.Backend]bool{}
	for _, bu := range cfg.BackendUnits() {
		got[bu.Backend] = bu.NetworkOpen
	}
	if !got[units.VLLM] || got[units.Ollama] {
		t.Errorf("NetworkOpen per backend %v, want only vllm open", got)
	}
	if def, err := Parse("test.yaml", []byte(minimal)); err != nil || def.Backends.VLLM.Network != units.NetworkFenced || !def.Profiles["p1"].Offline() {
		t.Errorf("defaults: backend network %q, profile offline %v (%v); want fenced and offline", def.Backends.VLLM.Network, def.Profiles["p1"].Offline(), err)
	}
}

// TestDaemonJoinsBackendGroup: gpuhost.service joins the default backend
// user's group (to read its model caches), and no other group, which might
// not exist and would keep gpuhost from starting.
func TestDaemonJoinsBackendGroup(t *testing.T) {
	for _, tt := range []struct {
		name, extra string
		want        []string
	}{
		{"default user", "", []string{units.DefaultBackendUser}},
		{"root", "backends:\n  vllm: {user: root}\n  ollama: {user: root}\n", nil},
		{"another user", "backends:\n  vllm: {user: llm}\n  ollama: {user: root}\n", nil},
		{"simulated", "backends:\n  vllm: {simulated: true, exec: [/usr/bin/gpuhost, simulate, vllm]}\n  ollama: {simulated: true, exec: [/usr/bin/gpuhost, simulate, ollama]}\n", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("test.yaml", []byte(minimal+tt.extra))
			if err != nil {
				t.Fatal(err)
			}
			d := cfg.DaemonUnit("/usr/bin/gpuhost", "/etc/gpuhost/gpuhost.yaml")
			if !slices.Equal(d.BackendGroups, tt.want) {
				t.Errorf("BackendGroups %q, want %q", d.BackendGroups, tt.want)
			}
			if got := strings.Contains(units.RenderDaemonUnit(d), "\nSupplementaryGroups="); got != (tt.want != nil) {
				t.Errorf("SupplementaryGroups= rendered %v, want %v", got, tt.want != nil)
			}
		})
	}
}
