package nas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"gopkg.in/yaml.v3"

	"gpuhost/internal/testkit"
	"gpuhost/mcp/connector"
)

const canaryPass = "CANARY-nas-pass-4b1d&x" // has a char that URL-encodes

// fakeDSM mimics the DSM Web API's entry.cgi: form or query parameters,
// {"success":…} envelopes, and sessions that expire after expireAfter
// calls with error 119 (0: never).
type fakeDSM struct {
	t           *testing.T
	user, pass  string
	expireAfter int
	loginHTML   bool // answer logins with an HTML error page echoing passwd
	slow        bool

	logins atomic.Int64
	mu     sync.Mutex
	nextID int
	left   map[string]int // sid -> calls left
}

func (f *fakeDSM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/webapi/entry.cgi" {
		http.NotFound(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	if f.slow {
		<-r.Context().Done()
		return
	}
	p := r.Form
	w.Header().Set("Content-Type", "application/json")
	fail := func(code int) {
		// Real DSM sends only the code; the fake also echoes the request
		// so a client that copies the body into errors would leak.
		fmt.Fprintf(w, `{"error":{"code":%d,"errors":{"passwd":%q,"sid":%q}},"success":false}`, code, p.Get("passwd"), p.Get("_sid"))
	}
	if p.Get("api") == "SYNO.API.Auth" {
		f.logins.Add(1)
		if f.loginHTML {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, "<html><body>Bad gateway for passwd=%s</body></html>", p.Get("passwd"))
			return
		}
		if p.Get("method") != "login" || p.Get("format") != "sid" || p.Get("version") != "6" {
			fail(101)
			return
		}
		if p.Get("account") != f.user || p.Get("passwd") != f.pass {
			fail(400)
			return
		}
		f.mu.Lock()
		f.nextID++
		sid := fmt.Sprintf("sid-%d", f.nextID)
		if f.left == nil {
			f.left = map[string]int{}
		}
		f.left[sid] = f.expireAfter
		f.mu.Unlock()
		fmt.Fprintf(w, `{"data":{"sid":%q},"success":true}`, sid)
		return
	}
	f.mu.Lock()
	left, ok := f.left[p.Get("_sid")]
	if ok && f.expireAfter != 0 {
		if left <= 0 {
			ok = false
			delete(f.left, p.Get("_sid"))
		} else {
			f.left[p.Get("_sid")] = left - 1
		}
	}
	f.mu.Unlock()
	if !ok {
		fail(119)
		return
	}
	switch p.Get("api") + "/" + p.Get("method") {
	case "SYNO.FileStation.List/list_share":
		fmt.Fprint(w, `{"data":{"offset":0,"shares":[
		 {"isdir":true,"name":"homes","path":"/homes","additional":{"volume_status":{"freespace":1000,"totalspace":4000,"readonly":false}}},
		 {"isdir":true,"name":"models","path":"/models"}],"total":2},"success":true}`)
	case "SYNO.Core.System.Utilization/get":
		fmt.Fprint(w, `{"data":{"cpu":{"15min_load":51,"1min_load":37,"5min_load":33,"device":"System","other_load":3,"system_load":2,"user_load":4},
		 "memory":{"avail_real":156104,"avail_swap":4194300,"buffer":10624,"cached":289352,"device":"Memory","memory_size":1048576,"real_usage":20,"si_disk":0,"so_disk":0,"swap_usage":0,"total_real":1008504,"total_swap":2097084},
		 "network":[{"device":"total","rx":1000,"tx":2000},{"device":"eth0","rx":1000,"tx":2000}],"time":1700000000},"success":true}`)
	case "SYNO.Storage.CGI.Storage/load_info":
		fmt.Fprint(w, `{"data":{"volumes":[{"id":"volume_1","vol_path":"/volume1","status":"normal","fs_type":"btrfs","size":{"total":"3990000000000","used":"997500000000"}},
		 {"id":"volume_2","vol_path":"/volume2","status":"degraded","fs_type":"ext4","size":{"total":"0","used":"0"}}]},"success":true}`)
	case "SYNO.Fake.Err/get":
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "<html>500 %s</html>", p.Get("_sid"))
	default:
		fail(102)
	}
}

func node(t *testing.T, src string) yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	return *doc.Content[0]
}

type rig struct {
	tools map[string]connector.Tool
	logs  *testkit.SyncBuffer
	fakes map[string]*fakeDSM
}

// newRig starts one fake per entry and builds the connector over them.
func newRig(t *testing.T, fakes map[string]*fakeDSM, secrets map[string]string, extra string) *rig {
	t.Helper()
	var cfg strings.Builder
	cfg.WriteString("timeout: 2s\nnas:\n")
	for name, f := range fakes {
		f.t = t
		srv := httptest.NewServer(f)
		t.Cleanup(srv.Close)
		fmt.Fprintf(&cfg, "  - {name: %s, url: %s, user: %s, password_env: PASS_%s}\n", name, srv.URL, f.user, strings.ToUpper(name))
	}
	cfg.WriteString(extra)
	logs := &testkit.SyncBuffer{}
	env := connector.Env{
		Name:   "nas",
		Config: node(t, cfg.String()),
		Secrets: connector.NewSecrets(func(n string) (string, bool) {
			v, ok := secrets[n]
			return v, ok
		}),
		HTTP: &http.Client{},
		Log:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	tools, err := (&builder{}).Build(env)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	r := &rig{tools: map[string]connector.Tool{}, logs: logs, fakes: fakes}
	for _, tl := range tools {
		r.tools[tl.Def.Name] = tl
	}
	return r
}

// call runs a tool and fails the test if the password or a sid shows up
// anywhere the model or the log could see it.
func (r *rig) call(t *testing.T, tool, nas string) (any, error) {
	t.Helper()
	tl, ok := r.tools[tool]
	if !ok {
		t.Fatalf("no tool %s", tool)
	}
	res, err := tl.Handler(context.Background(), connector.Args{"nas": nas})
	out, _ := json.Marshal(res)
	for _, s := range []string{string(out), fmt.Sprint(err), r.logs.String()} {
		if strings.Contains(s, canaryPass) || strings.Contains(s, "CANARY-nas-pass") || strings.Contains(s, "sid-") {
			t.Fatalf("%s(%s): secret or sid leaked: %s", tool, nas, s)
		}
	}
	return res, err
}

func TestTools(t *testing.T) {
	r := newRig(t, map[string]*fakeDSM{"main": {user: "ro", pass: canaryPass}}, map[string]string{"PASS_MAIN": canaryPass}, "")

	res, err := r.call(t, ToolShares, "main")
	if err != nil {
		t.Fatalf("shares: %v", err)
	}
	sh := res.(*Shares)
	if len(sh.Shares) != 2 || sh.Shares[0].Name != "homes" || sh.Shares[0].FreeBytes == nil || *sh.Shares[0].FreeBytes != 1000 ||
		*sh.Shares[0].TotalBytes != 4000 || sh.Shares[1].Path != "/models" || sh.Shares[1].TotalBytes != nil {
		t.Errorf("shares = %+v", sh.Shares)
	}

	res, err = r.call(t, ToolUtilization, "main")
	if err != nil {
		t.Fatalf("utilization: %v", err)
	}
	u := res.(*Utilization)
	if u.NAS != "main" || u.CPU.TotalPercent != 9 || u.CPU.UserPercent != 4 || u.Memory.TotalMiB != 1024 ||
		u.Memory.AvailableMiB != 152.4 || u.Memory.UsedPercent != 20 || len(u.Network) != 2 || u.Network[0].TxBytesPerS != 2000 {
		t.Errorf("utilization = %+v", u)
	}

	res, err = r.call(t, ToolVolumes, "main")
	if err != nil {
		t.Fatalf("volumes: %v", err)
	}
	v := res.(*Volumes).Volumes
	if len(v) != 2 || v[0].Path != "/volume1" || v[0].Status != "normal" || *v[0].TotalBytes != 3990000000000 ||
		*v[0].UsedPercent != 25 || v[1].Status != "degraded" || v[1].UsedPercent != nil {
		t.Errorf("volumes = %+v", v)
	}
	if got := r.fakes["main"].logins.Load(); got != 1 {
		t.Errorf("logins = %d, want 1 (session kept across calls)", got)
	}

	if _, err := r.call(t, ToolShares, "other"); err == nil || !strings.Contains(err.Error(), `unknown NAS "other"`) {
		t.Errorf("unknown NAS: err = %v", err)
	}
}

func TestReloginOnExpiredSession(t *testing.T) {
	// Each session allows 2 calls, then DSM answers 119.
	f := &fakeDSM{user: "ro", pass: canaryPass, expireAfter: 2}
	r := newRig(t, map[string]*fakeDSM{"main": f}, map[string]string{"PASS_MAIN": canaryPass}, "")
	for i := range 7 {
		if _, err := r.call(t, ToolUtilization, "main"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	// Calls 1-2 on sid-1, 3-4 on sid-2, 5-6 on sid-3, 7 on sid-4.
	if got := f.logins.Load(); got != 4 {
		t.Errorf("logins = %d, want 4", got)
	}
	if !strings.Contains(r.logs.String(), "logging in again") || !strings.Contains(r.logs.String(), "code=119") {
		t.Errorf("re-login not logged: %s", r.logs.String())
	}
}

func TestSessionErrorTwiceIsReported(t *testing.T) {
	// expireAfter -1: a fresh session is rejected at once, every time.
	f := &fakeDSM{user: "ro", pass: canaryPass, expireAfter: -1}
	r := newRig(t, map[string]*fakeDSM{"main": f}, map[string]string{"PASS_MAIN": canaryPass}, "")
	_, err := r.call(t, ToolVolumes, "main")
	if err == nil || !strings.Contains(err.Error(), "NAS 'main'") || !strings.Contains(err.Error(), "DSM error 119") {
		t.Fatalf("err = %v, want a session error naming the NAS", err)
	}
	if got := f.logins.Load(); got != 2 {
		t.Errorf("logins = %d, want 2 (one retry only)", got)
	}
}

func TestErrors(t *testing.T) {
	fakes := map[string]*fakeDSM{
		"wrongpass": {user: "ro", pass: "the-real-one"},
		"htmllogin": {user: "ro", pass: canaryPass, loginHTML: true},
		"slow":      {user: "ro", pass: canaryPass, slow: true},
		"nosecret":  {user: "ro", pass: canaryPass},
	}
	secrets := map[string]string{"PASS_WRONGPASS": canaryPass, "PASS_HTMLLOGIN": canaryPass, "PASS_SLOW": canaryPass}
	r := newRig(t, fakes, secrets, "")
	tests := []struct{ nas, want string }{
		{"wrongpass", `NAS 'wrongpass': login as "ro" failed: no such account or incorrect password (DSM error 400); check the account and the password in PASS_WRONGPASS`},
		{"htmllogin", "NAS 'htmllogin': login: HTTP 502: <html><body>Bad gateway for passwd=[redacted]"},
		{"slow", "NAS 'slow': login: no answer within 2s"},
		{"nosecret", "PASS_NOSECRET"},
	}
	for _, tc := range tests {
		t.Run(tc.nas, func(t *testing.T) {
			_, err := r.call(t, ToolShares, tc.nas)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want containing %q", err, tc.want)
			}
		})
	}
	var ms *connector.MissingSecretError
	if _, err := r.call(t, ToolShares, "nosecret"); !errors.As(err, &ms) || ms.Name != "PASS_NOSECRET" {
		t.Errorf("missing secret: err = %v, want *MissingSecretError", err)
	}
}

func TestAPIErrorsAfterLogin(t *testing.T) {
	f := &fakeDSM{user: "ro", pass: canaryPass}
	r := newRig(t, map[string]*fakeDSM{"main": f}, map[string]string{"PASS_MAIN": canaryPass}, "")
	// Reach a client directly for APIs no tool uses: 500 with the sid
	// echoed in HTML, and an unknown API.
	c := clientOf(t, r, "main")
	_, err := c.call(context.Background(), "SYNO.Fake.Err", 1, "get", nil)
	if err == nil || !strings.Contains(err.Error(), "HTTP 500") || strings.Contains(err.Error(), "sid-") {
		t.Errorf("500: err = %v", err)
	}
	_, err = c.call(context.Background(), "SYNO.Nope", 1, "get", nil)
	if err == nil || !strings.Contains(err.Error(), "the requested API does not exist (is the package installed") {
		t.Errorf("unknown API: err = %v", err)
	}
}

// clientOf builds a stand-alone client (own server, own session) over
// one of the rig's fakes, for calls to APIs no tool makes.
func clientOf(t *testing.T, r *rig, name string) *client {
	t.Helper()
	for n, f := range r.fakes {
		if n != name {
			continue
		}
		srv := httptest.NewServer(f)
		t.Cleanup(srv.Close)
		return newClient(NAS{Name: n, URL: srv.URL, User: f.user, PasswordEnv: "P"}, &http.Client{}, defaultTimeout,
			connector.NewSecrets(func(string) (string, bool) { return f.pass, true }), slog.New(slog.DiscardHandler))
	}
	t.Fatalf("no fake %s", name)
	return nil
}

func TestConcurrentCallsShareOneLogin(t *testing.T) {
	f := &fakeDSM{user: "ro", pass: canaryPass}
	r := newRig(t, map[string]*fakeDSM{"main": f}, map[string]string{"PASS_MAIN": canaryPass}, "")
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			_, err := r.tools[ToolUtilization].Handler(context.Background(), connector.Args{"nas": "main"})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := f.logins.Load(); got != 1 {
		t.Errorf("logins = %d, want 1", got)
	}
}

func TestConcurrentExpiryShareOneRelogin(t *testing.T) {
	// A session good for exactly the first call: every other concurrent
	// caller sees 119 on sid-1 and must join one re-login, not make its own.
	f := &fakeDSM{user: "ro", pass: canaryPass, expireAfter: 1000}
	r := newRig(t, map[string]*fakeDSM{"main": f}, map[string]string{"PASS_MAIN": canaryPass}, "")
	if _, err := r.call(t, ToolUtilization, "main"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.left["sid-1"] = 0
	f.mu.Unlock()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 16 {
		wg.Go(func() {
			if _, err := r.tools[ToolUtilization].Handler(context.Background(), connector.Args{"nas": "main"}); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	if got := f.logins.Load(); got != 2 {
		t.Errorf("logins = %d, want 2 (one initial, one shared re-login)", got)
	}
}

func TestInsecureTLS(t *testing.T) {
	f := &fakeDSM{user: "ro", pass: canaryPass}
	srv := httptest.NewUnstartedServer(f)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	for _, insecure := range []bool{false, true} {
		t.Run(fmt.Sprint(insecure), func(t *testing.T) {
			env := connector.Env{
				Name:    "nas",
				Config:  node(t, fmt.Sprintf("nas:\n  - {name: s, url: %s, user: ro, password_env: P, insecure_tls: %v}\n", srv.URL, insecure)),
				Secrets: connector.NewSecrets(func(string) (string, bool) { return canaryPass, true }),
				HTTP:    &http.Client{},
			}
			tools, err := (&builder{}).Build(env)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tools[0].Handler(context.Background(), connector.Args{"nas": "s"})
			if insecure && err != nil {
				t.Fatalf("insecure_tls true: %v", err)
			}
			if !insecure && (err == nil || !strings.Contains(err.Error(), "certificate")) {
				t.Fatalf("insecure_tls false: err = %v, want a certificate error", err)
			}
		})
	}
}

func TestToolDefinitions(t *testing.T) {
	r := newRig(t, map[string]*fakeDSM{"a": {user: "u"}}, nil, "")
	for _, name := range []string{ToolShares, ToolUtilization, ToolVolumes} {
		tl, ok := r.tools[name]
		if !ok {
			t.Fatalf("missing tool %s", name)
		}
		a := tl.Def.Annotations
		if !strings.HasPrefix(name, "nas_") || a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
			t.Errorf("%s annotations = %+v", name, a)
		}
		prop, _ := tl.Def.InputSchema.Properties["nas"].(map[string]any)
		if enum, _ := prop["enum"].([]string); len(enum) != 1 || enum[0] != "a" {
			t.Errorf("%s nas enum = %v", name, prop["enum"])
		}
		if tl.Targets == nil || tl.Targets.Param != "nas" {
			t.Errorf("%s targets = %+v", name, tl.Targets)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct{ name, cfg, want string }{
		{"none", "nas: []\n", "at least one NAS"},
		{"empty name", "nas:\n  - {name: '', url: https://n:5001, user: u, password_env: P}\n", "nas[0].name: must not be empty"},
		{"duplicate", "nas:\n  - {name: a, url: https://n:5001, user: u, password_env: P}\n  - {name: a, url: https://m:5001, user: u, password_env: P}\n", "duplicate NAS name"},
		{"relative url", "nas:\n  - {name: a, url: 'nas:5001', user: u, password_env: P}\n", "not an absolute http(s) URL"},
		{"no user", "nas:\n  - {name: a, url: https://n:5001, password_env: P}\n", "user: must not be empty"},
		{"no password env", "nas:\n  - {name: a, url: https://n:5001, user: u}\n", "password_env"},
		{"password inline", "nas:\n  - {name: a, url: https://n:5001, user: u, password: x}\n", "password"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := connector.Env{Name: "nas", Config: node(t, tc.cfg), Secrets: connector.NewSecrets(func(string) (string, bool) { return "", false })}
			_, err := (&builder{}).Build(env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want containing %q", err, tc.want)
			}
		})
	}
}

func FuzzParseResponse(f *testing.F) {
	f.Add([]byte(`{"data":{"sid":"x"},"success":true}`))
	f.Add([]byte(`{"error":{"code":119},"success":false}`))
	f.Add([]byte(`{"success":"yes"}`))
	f.Add([]byte(`<html>`))
	f.Fuzz(func(t *testing.T, b []byte) {
		data, err := ParseResponse(b)
		var de *DSMError
		if errors.As(err, &de) && de.Error() == "" {
			t.Fatal("empty DSM error text")
		}
		if err != nil {
			return
		}
		// Whatever data came back, the result parsers must not panic.
		_, _ = ParseShares(data)
		_, _ = ParseUtilization(data)
		_, _ = ParseVolumes(data)
	})
}

func FuzzParseVolumes(f *testing.F) {
	f.Add([]byte(`{"volumes":[{"id":"v","size":{"total":"10","used":"5"}}]}`))
	f.Add([]byte(`{"volumes":[{"size":{"total":1e400,"used":"-5"}}]}`))
	f.Add([]byte(`{"volumes":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		vs, err := ParseVolumes(b)
		if err != nil {
			return
		}
		for _, v := range vs {
			if v.UsedPercent != nil && (v.TotalBytes == nil) {
				t.Fatalf("percent without total: %+v", v)
			}
		}
	})
}
