package panel

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/units"
)

// profileRowHTML is the profiles table's row of one profile.
func profileRowHTML(t *testing.T, page, profile string) string {
	t.Helper()
	i := strings.Index(page, `<tr data-profile="`+profile+`"`)
	if i < 0 {
		t.Fatalf("no row for %s", profile)
	}
	row := page[i:]
	return row[:strings.Index(row, "</tr>")]
}

// After a switch away and back, the profile whose backend sleeps shows
// as in standby with the doctor's verdict of its standby checks, not as a
// failed endpoint; the doctor page says what is active and what sleeps.
func TestProfilesAndDoctorShowStandby(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.Profiles["coder"].Standby = units.StandbyAuto
		c.Profiles["llama"].Standby = units.StandbyUnload
	}}})
	for _, p := range []string{"llama", "coder"} {
		if evs, err := ev.f.SwitchTo(t, p); err != nil {
			t.Fatalf("switch to %s: %v%s", p, err, appliancetest.Describe(evs))
		}
	}
	c := ev.client(t)
	var live liveAnswer
	if resp, body := do(t, c, http.MethodGet, ev.srv.URL+"/live", nil, map[string]string{"Accept": "application/json"}); resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &live) != nil {
		t.Fatalf("/live: %d %s", resp.StatusCode, body)
	}
	if !strings.HasPrefix(live.Pill, "coder · ") || !strings.HasSuffix(live.Pill, " · llama in standby") {
		t.Errorf("the live pill does not name llama in standby: %q", live.Pill)
	}
	resp, body := do(t, c, "GET", ev.srv.URL+"/profiles?refresh=1", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("profiles: %d\n%s", resp.StatusCode, body)
	}
	llama := profileRowHTML(t, body, "llama")
	if !strings.Contains(llama, `<span class="badge badge-standby"`) || !strings.Contains(llama, "standby (unload)") {
		t.Errorf("llama's row does not show it in standby:\n%s", llama)
	}
	if !strings.Contains(llama, `<span class="badge sev-ok">ok</span>`) {
		t.Errorf("llama's doctor verdict is not ok:\n%s", llama)
	}
	if coder := profileRowHTML(t, body, "coder"); strings.Contains(coder, "badge-standby") || !strings.Contains(coder, `class="active"`) {
		t.Errorf("coder's row:\n%s", coder)
	}

	_, body = do(t, c, "GET", ev.srv.URL+"/doctor", nil, nil)
	for _, w := range []string{
		"Active: <strong>coder</strong>", "In standby: <strong>llama</strong> (" + ev.f.Cfg.Backends.Ollama.Unit + ", unload",
		"<code>standby.<wbr>asleep</code>", "<code>standby.<wbr>residual</code>", "<code>endpoint.<wbr>tool_calls</code>",
	} {
		if !strings.Contains(body, w) {
			t.Errorf("doctor page lacks %q", w)
		}
	}
	for _, row := range strings.Split(body, "<tr class=\"row-")[1:] {
		if strings.Contains(row, "<code>endpoint.") && strings.Contains(row, "<td>llama</td>") {
			t.Errorf("doctor page has an endpoint check on llama in standby: %s", row[:strings.Index(row, "</tr>")])
		}
		if strings.HasPrefix(row, "fail") && !strings.Contains(row, "coder-greedy") {
			t.Errorf("doctor page fails: %s", row[:strings.Index(row, "</tr>")])
		}
	}
}
