package appliance

import (
	_ "embed"
	"strings"
)

//go:embed demo.yaml
var demoYAML string

// DemoConfig is the embedded default that `gpuhost demo` runs: a simulated
// GPU, simulator backends started by the process runner, three profiles.
// self is the gpuhost binary (the simulator), state a writable directory.
func DemoConfig(self, state, listen string) (*Config, error) {
	r := strings.NewReplacer("{{SELF}}", self, "{{STATE}}", state, "{{LISTEN}}", listen)
	return ParseConfig("embedded demo config", []byte(r.Replace(demoYAML)))
}
