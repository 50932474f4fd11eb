package panel

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/testkit"
)

// env is a real Supervisor (simulated backends as real processes) behind
// the daemon's own echo server with the panel registered on it, served on
// a real loopback HTTP server.
type env struct {
	f *appliancetest.Fixture
	// box is the daemon's core when the env is a box of several lanes
	// (laneBoxEnv); f is nil then.
	box   *appliance.Box
	p     *Panel
	srv   *httptest.Server
	token string // the API token when the config listens beyond loopback
	// srvCleanup runs after the server has closed (the bench service).
	srvCleanup []func()
}

type envOptions struct {
	fixture appliancetest.Options
	// public makes the config listen on 0.0.0.0 with an API token file, so
	// the panel requires a login.
	public bool
	// register adds more to the daemon's echo server (the bench service)
	// before it is served.
	register func(ev *env, e *echo.Echo)
}

// testDaemon is the Daemon that internal/assemble builds from cfg.
func testDaemon(cfg *config.Config) Daemon {
	return Daemon{Listen: cfg.Listen, APIToken: cfg.APIToken, APITokenEnv: cfg.APITokenEnv,
		AuthFailuresPerMinute: cfg.HTTP.AuthFailuresPerMinute, Profiles: cfg.Profiles,
		Units: backendUnitNames(cfg)}
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ev := &env{}
	if o.public {
		ev.token = "s3cret-token-for-tests-0123456789"
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte(ev.token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		prev := o.fixture.Hook
		o.fixture.Hook = func(c *config.Config) {
			c.Listen = "0.0.0.0:0"
			c.APITokenFile = tokenFile
			if prev != nil {
				prev(c)
			}
		}
	}
	ev.f = appliancetest.New(t, o.fixture)
	httpAPI, err := httpapi.New(ev.f.Sup, ev.f.Doctor, ev.f.Log)
	if err != nil {
		t.Fatal(err)
	}
	d := testDaemon(ev.f.Cfg)
	d.Journal = JournalFunc(ev.f.Journal)
	ev.p, err = New(ev.f.Sup, ev.f.Doctor, d, ev.f.Log)
	if err != nil {
		t.Fatal(err)
	}
	ev.p.Register(httpAPI)
	if o.register != nil {
		o.register(ev, httpAPI)
	}
	ev.srv = httptest.NewServer(httpAPI)
	t.Cleanup(func() {
		// Event streams (a browser's EventSource) never end by themselves;
		// cut them so Close does not wait for them.
		ev.srv.CloseClientConnections()
		ev.srv.Close()
		for _, f := range ev.srvCleanup {
			f()
		}
	})
	return ev
}

// backendUnitNames are the configured backend units, as serve lists them.
func backendUnitNames(cfg *config.Config) []string {
	var names []string
	for _, bu := range cfg.BackendUnits() {
		names = append(names, bu.Name)
	}
	return names
}

// client is a browser-like client: a cookie jar and no automatic redirects,
// so tests see each answer.
func (ev *env) client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{
		Jar:           jar,
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// do sends a request and returns the response with its body read.
func do(t *testing.T, c *http.Client, method, u string, form url.Values, header map[string]string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if _, ok := header["Accept"]; !ok {
		req.Header.Set("Accept", "text/html")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, u, err)
	}
	return resp, string(data)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrfOf extracts the CSRF token a page rendered into its forms.
func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in page:\n%s", page)
	}
	return m[1]
}

// waitSwitched waits until the Supervisor has finished the switch id.
func waitSwitched(t *testing.T, sup *appliance.Supervisor, id string) *api.SwitchSummary {
	t.Helper()
	var ls *api.SwitchSummary
	if testkit.Poll(60*time.Second, func() bool { ls = sup.LastSwitch(); return ls != nil && ls.ID == id }) {
		return ls
	}
	t.Fatalf("switch %s did not finish within 60 s (state %+v)", id, sup.State())
	return nil
}

// cookieNamed finds a Set-Cookie of the response by name.
func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}
