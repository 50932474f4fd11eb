package units

import (
	"strings"
	"testing"
)

// TestRenderNetwork: a fenced unit has its own network and tells the
// server it is offline; an open one has neither, and its relay no longer
// joins a namespace that does not exist.
func TestRenderNetwork(t *testing.T) {
	for _, tt := range []struct {
		name        string
		unit        BackendUnit
		open        bool
		environment string
	}{
		{"vllm fenced", vllmUnit(), false, "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1"},
		{"ollama fenced", simUnit(), false, "OLLAMA_NO_CLOUD=1 DO_NOT_TRACK=1"},
		{"vllm open", func() BackendUnit { u := vllmUnit(); u.NetworkOpen = true; return u }(), true, ""},
		{"ollama open", func() BackendUnit { u := simUnit(); u.NetworkOpen = true; return u }(), true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.unit.Ports = []int{8000}
			if err := tt.unit.Validate(); err != nil {
				t.Fatal(err)
			}
			text := RenderBackendUnit(tt.unit)
			uf := mustParse(t, text)
			env := uf.Values("Service", "Environment")
			priv, hasPriv := uf.Value("Service", "PrivateNetwork")
			switch {
			case tt.open && (hasPriv || len(env) > 0):
				t.Errorf("open unit: PrivateNetwork=%q (set %v), Environment=%q; want neither", priv, hasPriv, env)
			case tt.open && !strings.Contains(text, "network: open"):
				t.Errorf("open unit does not name the opening:\n%s", text)
			case !tt.open && (priv != "yes" || len(env) != 1 || env[0] != tt.environment):
				t.Errorf("fenced unit: PrivateNetwork=%q, Environment=%q; want yes and %q", priv, env, tt.environment)
			}
			for _, r := range RenderProxyUnits(tt.unit) {
				if !strings.HasSuffix(r.Name, ".service") {
					continue
				}
				pf := mustParse(t, r.Content)
				_, joins := pf.Value("Unit", "JoinsNamespaceOf")
				_, ppriv := pf.Value("Service", "PrivateNetwork")
				if joins == tt.open || ppriv == tt.open {
					t.Errorf("relay %s: JoinsNamespaceOf set %v, PrivateNetwork set %v; want both %v", r.Name, joins, ppriv, !tt.open)
				}
			}
		})
	}
}

func TestMissingOffline(t *testing.T) {
	for _, tt := range []struct {
		backend Backend
		env     map[string]string
		want    string
	}{
		{VLLM, nil, "HF_HUB_OFFLINE TRANSFORMERS_OFFLINE VLLM_NO_USAGE_STATS DO_NOT_TRACK"},
		{VLLM, map[string]string{"HF_HUB_OFFLINE": "TRUE", "TRANSFORMERS_OFFLINE": "on", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": " yes "}, ""},
		{VLLM, map[string]string{"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}, "HF_HUB_OFFLINE"},
		{Ollama, map[string]string{"OLLAMA_NO_CLOUD": "1"}, "DO_NOT_TRACK"},
		{Ollama, map[string]string{"OLLAMA_NO_CLOUD": "1", "DO_NOT_TRACK": "1"}, ""},
	} {
		got := strings.Join(MissingOffline(tt.backend, func(k string) string { return tt.env[k] }), " ")
		if got != tt.want {
			t.Errorf("%s %v: missing %q, want %q", tt.backend, tt.env, got, tt.want)
		}
	}
}

func TestValidateNetwork(t *testing.T) {
	for _, n := range []Network{"", NetworkOffline, NetworkOpen, "fenced", "closed"} {
		p := qwenCoder()
		p.Network = n
		var got string
		for _, fe := range p.Validate() {
			if fe.Key == "network" {
				got = fe.Msg
			}
		}
		if bad := n == "fenced" || n == "closed"; bad != (got != "") {
			t.Errorf("network %q: error %q", n, got)
		}
	}
}
