package appliance

import (
	"strings"
	"testing"

	"gpuhost/units"
)

// TestDoctorAPIsCheck: the verify step records the APIs the simulated
// backends serve (shown in /api/profiles); endpoint.apis finds both agent APIs with a working
// tool call on the simulated vLLM and Ollama, and keeps the verdict per
// backend process (a second run sends no probe to the vLLM).
func TestDoctorAPIsCheck(t *testing.T) {
	f := newProcFixture(t, "10ms")
	for _, profile := range []string{"coder", "llama"} {
		if _, err := f.switchTo(t, profile); err != nil {
			t.Fatal(err)
		}
		for _, info := range f.sup.Profiles() {
			if info.Name == profile && strings.Join(info.APIs, ",") != "chat,messages,count_tokens,responses" {
				t.Errorf("%s: the verify step found the APIs %v", profile, info.APIs)
			}
		}
		c := agentCheck(t, f, "endpoint.apis", profile)
		if c.Severity != units.SeverityOK || c.Value != "messages (tool call ok), responses (tool call ok)" {
			t.Errorf("%s: endpoint.apis %+v", profile, c)
		}
		if profile != "coder" {
			continue // the request counter is vLLM's /metrics
		}
		before := simRequests(t, f.cfg.Profiles[profile].Port)
		c2 := agentCheck(t, f, "endpoint.apis", profile)
		kept := c2
		kept.Message = c.Message
		if kept != c || !strings.HasPrefix(c2.Message, c.Message+" (probed ") || simRequests(t, f.cfg.Profiles[profile].Port) != before {
			t.Errorf("%s: a second run probed again or hid the verdict's age (%+v)", profile, c2)
		}
	}
}
