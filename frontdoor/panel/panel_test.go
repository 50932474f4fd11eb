package panel

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/units"

	"github.com/labstack/echo/v4"
)

func TestPagesRender(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	tests := []struct {
		path    string
		want    []string
		notWant []string
	}{
		{"/", []string{
			"NVIDIA GeForce RTX 4090", "610.43.02", "13.0", // GPU name, driver, CUDA
			`class="bar-fg" width="`, "GiB", // the memory bar
			"Utilisation", "Temperature", "°C", "Power", "simulated GPU",
			"qwen3-coder", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "vllm", // active profile, backend
			"gpuhost-vllm.service", "gpuhost-ollama.service", // units
			"healthy", "/health", // endpoint health
			"Last switch", "coder", "sev-ok", // last switch and its outcome
			`id="phase" class="pill phase-active"`,
		}, []string{"Log out"}},
		{"/profiles", []string{
			`data-profile="coder"`, `data-profile="coder-greedy"`, `data-profile="llama"`,
			`<tr data-profile="coder" data-backend="vllm" class="active">`,
			"gpu_memory_utilization=0.92", "max_num_seqs=32", "max_model_len=32768", "tool_call_parser=qwen3_xml",
			"gpu_memory_utilization=0.96", "keep_alive=", "llama3.1:8b",
			`<span class="badge sev-fail">fail</span>`, // coder-greedy's doctor verdict
			`action="/switch"`, `name="profile" value="llama"`, "Switch",
			`<div class="muted small apis">APIs: chat, messages, count_tokens, responses</div>`, // found at coder's verify
		}, []string{`id="progress" class="card progress outcome-`}},
		{"/doctor", []string{
			"<th>Severity</th>", "<th>Check</th>", "<th>Profile</th>", "<th>Message</th>", "<th>Fix</th>",
			"gpu.<wbr>driver", "gpu.<wbr>nvml", "units.<wbr>exclusive", "coder-greedy", "worst: fail",
		}, nil},
		{"/static/panel.css", []string{".bar-fg"}, nil},
		{"/static/panel.js", []string{"EventSource", "VRAM released"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, body := do(t, c, "GET", ev.srv.URL+tt.path, nil, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d:\n%s", resp.StatusCode, body)
			}
			for _, w := range tt.want {
				if !strings.Contains(body, w) {
					t.Errorf("page lacks %q", w)
				}
			}
			for _, nw := range tt.notWant {
				if strings.Contains(body, nw) {
					t.Errorf("page has %q", nw)
				}
			}
			if strings.HasSuffix(tt.path, ".css") || strings.HasSuffix(tt.path, ".js") {
				return
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
				t.Errorf("Content-Type %q", ct)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
				t.Errorf("CSP %q", csp)
			}
		})
	}
}

// A model and served name full of markup must render as text everywhere.
func TestEscaping(t *testing.T) {
	const evil = `<script>alert(1)</script>`
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		p := c.Profiles["coder-greedy"]
		p.Model, p.ServedName = evil, evil
		p.Aliases = []string{`<img/src/onerror=alert(2)>`}
	}}})
	// The config validation accepts these (no whitespace, quotes or
	// backslashes), so a config file can carry them.
	if errs := ev.f.Cfg.Profiles["coder-greedy"].Validate(); len(errs) != 0 {
		t.Fatalf("the hostile names do not pass validation: %v", errs)
	}
	c := ev.client(t)
	for _, path := range []string{"/", "/profiles", "/doctor", "/" + url.PathEscape(evil)} {
		t.Run(path, func(t *testing.T) {
			_, body := do(t, c, "GET", ev.srv.URL+path, nil, nil)
			if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img") {
				t.Errorf("unescaped markup in %s:\n%s", path, body)
			}
		})
	}
	_, body := do(t, c, "GET", ev.srv.URL+"/profiles", nil, nil)
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the model name is not shown escaped:\n%s", body)
	}
	// A doctor refusal echoes the profile's checks; still text.
	tok := csrfOf(t, body)
	resp, body := do(t, c, "POST", ev.srv.URL+"/switch", url.Values{"csrf": {tok}, "profile": {"coder-greedy"}}, nil)
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("switch to coder-greedy: status %d", resp.StatusCode)
	}
	if strings.Contains(body, "<script>alert") {
		t.Errorf("unescaped markup in the refusal:\n%s", body)
	}
}

func TestCSRF(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	_, page := do(t, c, "GET", ev.srv.URL+"/profiles", nil, nil)
	tok := csrfOf(t, page)
	fresh := ev.client(t) // a browser that never loaded a page: no CSRF cookie
	tests := []struct {
		name   string
		client *http.Client
		form   url.Values
		header map[string]string
	}{
		{"no token", c, url.Values{"profile": {"llama"}}, nil},
		{"wrong token", c, url.Values{"profile": {"llama"}, "csrf": {"AAAA" + tok[4:]}}, nil},
		{"token in the wrong header", c, url.Values{"profile": {"llama"}}, map[string]string{"X-Csrf": tok}},
		{"cross-site fetch metadata", c, url.Values{"profile": {"llama"}, "csrf": {tok}}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"same-site but not same-origin", c, url.Values{"profile": {"llama"}, "csrf": {tok}}, map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"foreign Origin", c, url.Values{"profile": {"llama"}, "csrf": {tok}}, map[string]string{"Origin": "http://evil.example"}},
		{"null Origin", c, url.Values{"profile": {"llama"}, "csrf": {tok}}, map[string]string{"Origin": "null"}},
		{"another browser's token", fresh, url.Values{"profile": {"llama"}, "csrf": {tok}}, nil},
		{"JSON fetch without header", c, url.Values{"profile": {"llama"}}, map[string]string{"Accept": "application/json"}},
		{"oversized body", c, url.Values{"profile": {"llama"}, "pad": {strings.Repeat("x", maxFormBytes)}, "csrf": {tok}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, tt.client, "POST", ev.srv.URL+"/switch", tt.form, tt.header)
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("status %d, want 403:\n%s", resp.StatusCode, body)
			}
			if st := ev.f.Sup.State(); st.Phase != api.PhaseActive || st.Profile != "coder" || ev.f.Sup.LastSwitch().Profile != "coder" {
				t.Fatalf("a refused POST changed the state: %+v", st)
			}
		})
	}
	// The same POST with the token in the header, as the script sends it,
	// with the browser's own provenance headers, is accepted.
	u, _ := url.Parse(ev.srv.URL)
	resp, body := do(t, c, "POST", ev.srv.URL+"/switch", url.Values{"profile": {"llama"}}, map[string]string{
		"Accept": "application/json", csrfHeader: tok, "Sec-Fetch-Site": "same-origin", "Origin": "http://" + u.Host,
	})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("valid POST: status %d:\n%s", resp.StatusCode, body)
	}
	var acc switchAccepted
	if err := json.Unmarshal([]byte(body), &acc); err != nil {
		t.Fatal(err)
	}
	if ls := waitSwitched(t, ev.f.Sup, acc.SwitchID); !ls.OK || ls.Profile != "llama" {
		t.Fatalf("switch: %+v", ls)
	}
}

// Without JavaScript the Switch button is a form POST; the answer is a
// redirect to a page that shows the switch's progress and outcome.
func TestFormSwitchFallback(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	_, page := do(t, c, "GET", ev.srv.URL+"/profiles", nil, nil)
	tok := csrfOf(t, page)
	resp, body := do(t, c, "POST", ev.srv.URL+"/switch", url.Values{"csrf": {tok}, "profile": {"llama"}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("status %d, want 303:\n%s", resp.StatusCode, body)
	}
	loc := resp.Header.Get("Location")
	id, ok := strings.CutPrefix(loc, "/profiles?switch=")
	if !ok || !switchIDRE.MatchString(id) {
		t.Fatalf("Location %q", loc)
	}
	// While it runs, the page refreshes itself for readers without script.
	_, running := do(t, c, "GET", ev.srv.URL+loc, nil, nil)
	if !strings.Contains(running, `data-switch-id="`+id+`"`) {
		t.Fatalf("progress page lacks the switch:\n%s", running)
	}
	if ls := waitSwitched(t, ev.f.Sup, id); !ls.OK {
		t.Fatalf("switch failed: %+v", ls)
	}
	resp, done := do(t, c, "GET", ev.srv.URL+loc, nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, w := range []string{
		"stopped", "VRAM released", "→", "GiB", "configured", "started", "ready", "model loaded", "verified",
		"llama is active (total ", `class="card progress outcome-done"`, `data-running="false"`,
		`<tr data-profile="llama" data-backend="ollama" class="active">`,
	} {
		if !strings.Contains(done, w) {
			t.Errorf("finished progress page lacks %q", w)
		}
	}
	if strings.Contains(done, `http-equiv="refresh"`) {
		t.Error("a finished switch still refreshes the page")
	}
}

func TestSwitchRefusals(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	_, page := do(t, c, "GET", ev.srv.URL+"/profiles", nil, nil)
	tok := csrfOf(t, page)
	tests := []struct {
		name    string
		form    url.Values
		json    bool
		code    int
		want    string
		wantErr string
	}{
		{"unknown profile, form", url.Values{"profile": {"nope"}}, false, http.StatusNotFound, "There is no profile &#34;nope&#34;", ""},
		{"unknown profile, JSON", url.Values{"profile": {"nope"}}, true, http.StatusNotFound, "", "unknown profile"},
		{"doctor refusal, form", url.Values{"profile": {"coder-greedy"}}, false, http.StatusUnprocessableEntity, "Switch to coder-greedy anyway", ""},
		{"doctor refusal, JSON", url.Values{"profile": {"coder-greedy"}}, true, http.StatusUnprocessableEntity, "force_profile", "profile fails doctor checks"},
		{"malformed switch id", nil, false, http.StatusBadRequest, "malformed", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var resp *http.Response
			var body string
			if tt.form == nil {
				resp, body = do(t, c, "GET", ev.srv.URL+"/profiles?switch=%3Cx%3E", nil, nil)
			} else {
				tt.form.Set("csrf", tok)
				h := map[string]string{}
				if tt.json {
					h["Accept"] = "application/json"
				}
				resp, body = do(t, c, "POST", ev.srv.URL+"/switch", tt.form, h)
			}
			if resp.StatusCode != tt.code {
				t.Fatalf("status %d, want %d:\n%s", resp.StatusCode, tt.code, body)
			}
			if !strings.Contains(body, tt.want) {
				t.Errorf("answer lacks %q:\n%s", tt.want, body)
			}
			if tt.json {
				var ae api.APIError
				if err := json.Unmarshal([]byte(body), &ae); err != nil || ae.Error != tt.wantErr {
					t.Errorf("JSON error %+v (%v), want %q", ae, err, tt.wantErr)
				}
			}
		})
	}
	if st := ev.f.Sup.State(); st.Profile != "coder" {
		t.Fatalf("a refused switch changed the state: %+v", st)
	}
}

// A second switch while one runs is refused with 409 and the running
// switch's step; the page then shows the running switch's progress.
func TestSwitchBusy(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "llama", VLLMLoad: "1500ms"}})
	c := ev.client(t)
	_, page := do(t, c, "GET", ev.srv.URL+"/profiles", nil, nil)
	tok := csrfOf(t, page)
	resp, body := do(t, c, "POST", ev.srv.URL+"/switch", url.Values{"csrf": {tok}, "profile": {"coder"}}, map[string]string{"Accept": "application/json"})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("first switch: %d %s", resp.StatusCode, body)
	}
	var acc switchAccepted
	if err := json.Unmarshal([]byte(body), &acc); err != nil {
		t.Fatal(err)
	}
	if acc.Backend != "vllm" || acc.Events != "/api/events?since="+strconv.FormatUint(acc.Since, 10) || acc.BeforeMiB <= 0 {
		t.Errorf("accepted: %+v", acc)
	}
	resp, body = do(t, c, "POST", ev.srv.URL+"/switch", url.Values{"csrf": {tok}, "profile": {"llama"}}, nil)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "already running") {
		t.Fatalf("second switch: status %d:\n%s", resp.StatusCode, body)
	}
	// The plain profiles page follows the running switch.
	if !strings.Contains(body, `data-switch-id="`+acc.SwitchID+`"`) || !strings.Contains(body, `data-running="true"`) ||
		!strings.Contains(body, `<noscript><meta http-equiv="refresh" content="2"></noscript>`) {
		t.Errorf("the page does not show the running switch:\n%s", body)
	}
	waitSwitched(t, ev.f.Sup, acc.SwitchID)
}

func TestNotFound(t *testing.T) {
	for _, public := range []bool{false, true} {
		name := "loopback"
		if public {
			name = "public"
		}
		t.Run(name, func(t *testing.T) {
			ev := newEnv(t, envOptions{public: public})
			c := ev.client(t)
			tests := []struct {
				path, accept string
				json         bool
			}{
				{"/nope", "text/html,application/xhtml+xml", false},
				{"/profiles/", "text/html", false},
				{"/static/missing.css", "text/html", false},
				{"/static/../api/status", "text/html", false},
				{"/api/nope", "text/html", true},
				{"/nope", "application/json", true},
			}
			for _, tt := range tests {
				hdr := map[string]string{"Accept": tt.accept}
				if public && strings.HasPrefix(tt.path, "/api/") {
					// Beyond loopback an unknown API path answers only
					// after the bearer check: 401 first, no route discovery.
					if resp, body := do(t, c, "GET", ev.srv.URL+tt.path, nil, hdr); resp.StatusCode != http.StatusUnauthorized {
						t.Errorf("%s without the token: status %d, want 401:\n%s", tt.path, resp.StatusCode, body)
					}
					hdr["Authorization"] = "Bearer " + ev.token
				}
				resp, body := do(t, c, "GET", ev.srv.URL+tt.path, nil, hdr)
				if resp.StatusCode != http.StatusNotFound {
					t.Errorf("%s: status %d, want 404:\n%s", tt.path, resp.StatusCode, body)
					continue
				}
				ct := resp.Header.Get("Content-Type")
				if tt.json != strings.HasPrefix(ct, "application/json") {
					t.Errorf("%s (Accept %s): Content-Type %q", tt.path, tt.accept, ct)
				}
				if !tt.json && !strings.Contains(body, "404 · Not found") {
					t.Errorf("%s: not the 404 page:\n%s", tt.path, body)
				}
			}
		})
	}
}

// A loopback panel trusts local clients, so it must refuse a Host that is
// not local (a web page that rebinds its DNS name to 127.0.0.1).
func TestLoopbackRejectsForeignHost(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	for _, host := range []string{"evil.example", "evil.example:80", "127.0.0.1.nip.io"} {
		req, _ := http.NewRequest("GET", ev.srv.URL+"/", nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("Host %s: status %d, want 421", host, resp.StatusCode)
		}
		if strings.Contains(string(body), `id="phase"`) || strings.Contains(string(body), "coder") {
			t.Errorf("Host %s: the refusal shows the backend state:\n%s", host, body)
		}
	}
}

func TestLoginFlow(t *testing.T) {
	ev := newEnv(t, envOptions{public: true, fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	base := ev.srv.URL

	// Not logged in: pages redirect to the login, the API wants its bearer.
	resp, _ := do(t, c, "GET", base+"/profiles?x=1", nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next=%2Fprofiles%3Fx%3D1" {
		t.Fatalf("anonymous /profiles: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, path := range []string{"/api/status", "/api/events"} {
		if resp, _ := do(t, c, "GET", base+path, nil, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("anonymous %s: %d, want 401", path, resp.StatusCode)
		}
	}
	resp, page := do(t, c, "GET", base+"/login?next=%2Fprofiles", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, `name="token"`) || strings.Contains(page, `id="phase"`) {
		t.Fatalf("login page: %d:\n%s", resp.StatusCode, page)
	}
	tok := csrfOf(t, page)

	tests := []struct {
		name   string
		form   url.Values
		header map[string]string
		code   int
	}{
		{"wrong token", url.Values{"csrf": {tok}, "token": {"guess"}, "next": {"/profiles"}}, nil, http.StatusUnauthorized},
		{"empty token", url.Values{"csrf": {tok}, "next": {"/profiles"}}, nil, http.StatusUnauthorized},
		{"no CSRF token", url.Values{"token": {ev.token}, "next": {"/profiles"}}, nil, http.StatusForbidden},
		{"cross-site", url.Values{"csrf": {tok}, "token": {ev.token}}, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
	}
	for _, tt := range tests {
		resp, body := do(t, c, "POST", base+"/login", tt.form, tt.header)
		if resp.StatusCode != tt.code || cookieNamed(resp, sessionCookie) != nil {
			t.Fatalf("%s: status %d (want %d), cookies %v:\n%s", tt.name, resp.StatusCode, tt.code, resp.Cookies(), body)
		}
	}
	if ev.p.sessions.len() != 0 {
		t.Fatalf("failed logins left %d sessions", ev.p.sessions.len())
	}

	resp, _ = do(t, c, "POST", base+"/login", url.Values{"csrf": {tok}, "token": {ev.token}, "next": {"/profiles"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/profiles" {
		t.Fatalf("login: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	ck := cookieNamed(resp, sessionCookie)
	if ck == nil {
		t.Fatal("no session cookie")
	}
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure || ck.MaxAge != int(SessionTTL/time.Second) || !validToken(ck.Value) {
		t.Errorf("session cookie %+v", ck)
	}
	if csrf := cookieNamed(resp, csrfCookie); csrf != nil {
		t.Errorf("the CSRF cookie was replaced at login: %+v", csrf)
	}

	// Logged in: pages, read-only API (the page's EventSource), no API writes.
	resp, page = do(t, c, "GET", base+"/profiles", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Log out") {
		t.Fatalf("/profiles after login: %d", resp.StatusCode)
	}
	if resp, body := do(t, c, "GET", base+"/api/status", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/status with a session: %d %s", resp.StatusCode, body)
	}
	assertEventStream(t, c, base+"/api/events")
	if resp, _ := do(t, c, "POST", base+"/api/switch", nil, map[string]string{"Content-Type": "application/json"}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST /api/switch with only a session: %d, want 401", resp.StatusCode)
	}
	if resp, body := do(t, http.DefaultClient, "GET", base+"/api/status", nil, map[string]string{"Authorization": "Bearer " + ev.token}); resp.StatusCode != http.StatusOK {
		t.Fatalf("bearer API access broke: %d %s", resp.StatusCode, body)
	}
	// The login page of a logged-in browser goes where it was asked to.
	if resp, _ := do(t, c, "GET", base+"/login?next=//evil.example/", nil, nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("login page when logged in: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A switch from the page works with the session's token.
	tok2 := csrfOf(t, page)
	if tok2 == tok {
		t.Error("the CSRF token did not change with the session")
	}
	resp, body := do(t, c, "POST", base+"/switch", url.Values{"csrf": {tok}, "profile": {"llama"}}, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the pre-login token still works: %d %s", resp.StatusCode, body)
	}
	resp, _ = do(t, c, "POST", base+"/switch", url.Values{"csrf": {tok2}, "profile": {"llama"}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("switch with a session: %d", resp.StatusCode)
	}
	waitSwitched(t, ev.f.Sup, strings.TrimPrefix(resp.Header.Get("Location"), "/profiles?switch="))

	// Logout ends the session on the server, not only in the browser.
	stolen := ck.Value
	resp, _ = do(t, c, "POST", base+"/logout", url.Values{"csrf": {tok2}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("logout: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if gone := cookieNamed(resp, sessionCookie); gone == nil || gone.MaxAge >= 0 {
		t.Errorf("logout did not clear the cookie: %+v", gone)
	}
	replay := ev.client(t)
	u, _ := url.Parse(base)
	replay.Jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: stolen}})
	if resp, _ := do(t, replay, "GET", base+"/", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a logged-out session still works: %d", resp.StatusCode)
	}
}

// The cookie is Secure when the browser talks HTTPS (here through a
// reverse proxy on loopback that says so), and rotating the API token ends
// every session.
func TestSessionSecureAndTokenRotation(t *testing.T) {
	ev := newEnv(t, envOptions{public: true})
	c := ev.client(t)
	_, page := do(t, c, "GET", ev.srv.URL+"/login", nil, map[string]string{"X-Forwarded-Proto": "https"})
	tok := csrfOf(t, page)
	resp, _ := do(t, c, "POST", ev.srv.URL+"/login", url.Values{"csrf": {tok}, "token": {ev.token}}, map[string]string{"X-Forwarded-Proto": "https"})
	ck := cookieNamed(resp, sessionCookie)
	if resp.StatusCode != http.StatusSeeOther || ck == nil || !ck.Secure {
		t.Fatalf("login over https: %d, cookie %+v", resp.StatusCode, ck)
	}
	u, _ := url.Parse(ev.srv.URL)
	plain := ev.client(t) // send the cookie over plain http ourselves
	plain.Jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: ck.Value}})
	if resp, _ := do(t, plain, "GET", ev.srv.URL+"/", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("session before rotation: %d", resp.StatusCode)
	}
	if err := os.WriteFile(ev.f.Cfg.APITokenFile, []byte("a-new-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, plain, "GET", ev.srv.URL+"/", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("session after token rotation: %d, want a redirect to the login", resp.StatusCode)
	}
}

func assertEventStream(t *testing.T, c *http.Client, u string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, ": gpuhost events") {
		t.Fatalf("event stream starts with %q (%v)", line, err)
	}
}

func TestNewRequiresTokenBeyondLoopback(t *testing.T) {
	cfg, err := config.Parse("t", []byte("listen: 0.0.0.0:8080\napi_token_env: GPUHOST_PANEL_TEST_UNSET_TOKEN\nprofiles:\n  a: {backend: ollama, model: m, port: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(appliance.NewSupervisor(cfg, nil, nil, nil, nil), nil, testDaemon(cfg), nil)
	if err == nil || !strings.Contains(err.Error(), "GPUHOST_PANEL_TEST_UNSET_TOKEN") {
		t.Fatalf("New without a token beyond loopback: %v", err)
	}
}

// TestDashboardShowsStandby: a profile left in standby by a switch is on
// the dashboard, with its mode and what it may hold.
func TestDashboardShowsStandby(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.Profiles["coder"].Standby = units.StandbyAuto
		c.Profiles["llama"].Standby = units.StandbyUnload
	}}})
	if _, err := ev.f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	_, body := do(t, ev.client(t), "GET", ev.srv.URL+"/", nil, nil)
	if !strings.Contains(body, `id="standby-coder"`) || !strings.Contains(body, "sleep1, holds ≤ 0.5 GiB") {
		t.Errorf("the dashboard does not show coder in standby:\n%s", body)
	}
}

// TestEveryRouteNeedsASessionBeyondLoopback walks every route the panel
// registered (so a page added later is covered without editing this
// test): without a session, GETs redirect to the login and answer no page
// content, POSTs are refused; only the login and static files are open.
func TestEveryRouteNeedsASessionBeyondLoopback(t *testing.T) {
	ev := newEnv(t, envOptions{public: true, fixture: appliancetest.Options{Activate: "coder"}})
	open := map[string]bool{"/login": true, "/static/*": true, "/*": true}
	var seen int
	for _, r := range ev.p.router.Routes() {
		if !ev.p.owned[r.Path] || open[r.Path] {
			continue
		}
		seen++
		c := ev.client(t)
		path := strings.ReplaceAll(r.Path, "*", "x")
		resp, body := do(t, c, r.Method, ev.srv.URL+path, url.Values{"uid": {"1"}, "profile": {"llama"}}, nil)
		switch {
		case r.Method == http.MethodGet && (resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login")):
			t.Errorf("anonymous GET %s: %d %q, want a redirect to the login", r.Path, resp.StatusCode, resp.Header.Get("Location"))
		case r.Method != http.MethodGet && resp.StatusCode < 400:
			t.Errorf("anonymous %s %s: %d, want refused", r.Method, r.Path, resp.StatusCode)
		case strings.Contains(body, "qwen3-coder") || strings.Contains(body, "VRAM"):
			t.Errorf("anonymous %s %s leaked page content:\n%.300s", r.Method, r.Path, body)
		}
	}
	if seen < 15 {
		t.Fatalf("walked %d panel routes; the route table was not read", seen)
	}
	if st := ev.f.Sup.State(); st.Profile != "coder" || st.Phase != api.PhaseActive {
		t.Errorf("an anonymous POST changed the state: %+v", st)
	}
}

// The cookies are Secure over TLS and beyond loopback whatever the request
// says; X-Forwarded-Proto counts only from a loopback peer (a TLS proxy on
// this machine).
func TestSecureRequest(t *testing.T) {
	tests := []struct {
		name   string
		remote string
		tls    bool
		xfp    string
		want   bool
	}{
		{"loopback plain http", "127.0.0.1:40000", false, "", false},
		{"loopback ipv6 plain http", "[::1]:40000", false, "", false},
		{"loopback proxy says https", "127.0.0.1:40000", false, "https", true},
		{"loopback proxy says http", "127.0.0.1:40000", false, "http", false},
		{"loopback over tls", "127.0.0.1:40000", true, "", true},
		{"lan plain http", "192.168.1.20:40000", false, "", true},
		{"lan claims http", "192.168.1.20:40000", false, "http", true},
		{"lan ipv6", "[fd00::7]:40000", false, "", true},
	}
	e := echo.New()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "http://box/login", nil)
			r.RemoteAddr = tc.remote
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			if tc.xfp != "" {
				r.Header.Set("X-Forwarded-Proto", tc.xfp)
			}
			if got := secureRequest(e.NewContext(r, httptest.NewRecorder())); got != tc.want {
				t.Errorf("secureRequest = %v, want %v", got, tc.want)
			}
		})
	}
}

// A throttled address still logs in with the right token (before: 429 for
// the rest of the minute, so a guesser on the same address locked the
// owner out); wrong tokens from it get 429 and close the connection.
func TestLoginThrottleLetsTheRightTokenThrough(t *testing.T) {
	ev := newEnv(t, envOptions{public: true})
	c := ev.client(t)
	base := ev.srv.URL
	_, page := do(t, c, "GET", base+"/login", nil, nil)
	tok := csrfOf(t, page)
	throttled := false
	for i := 0; i < 50 && !throttled; i++ {
		resp, _ := do(t, c, "POST", base+"/login", url.Values{"csrf": {tok}, "token": {"guess-" + strconv.Itoa(i)}}, nil)
		switch resp.StatusCode {
		case http.StatusTooManyRequests:
			throttled = resp.Header.Get("Retry-After") != ""
		case http.StatusUnauthorized:
		default:
			t.Fatalf("wrong token #%d: %d", i, resp.StatusCode)
		}
		if !resp.Close {
			t.Fatalf("wrong token #%d: the connection stays open (want Connection: close)", i)
		}
	}
	if !throttled {
		t.Fatal("50 wrong tokens were never throttled")
	}
	resp, _ := do(t, c, "POST", base+"/login", url.Values{"csrf": {tok}, "token": {ev.token}, "next": {"/profiles"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || cookieNamed(resp, sessionCookie) == nil {
		t.Fatalf("right token from a throttled address: %d, want 303 with a session", resp.StatusCode)
	}
}
