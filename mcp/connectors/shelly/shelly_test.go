package shelly

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const canaryKey = "CANARY-shelly-key-7f3a9c" // recognisable so a leak is obvious

// A Gen2 status as documented for Shelly.GetStatus (Plus Plug S).
const gen2Status = `{
 "ble": {}, "cloud": {"connected": true}, "mqtt": {"connected": false},
 "switch:0": {"id": 0, "source": "init", "output": true, "apower": 123.4, "voltage": 231.2, "current": 0.61,
   "aenergy": {"total": 1017.3, "by_minute": [0, 0, 0], "minute_ts": 1700000000},
   "temperature": {"tC": 41.7, "tF": 107.1}},
 "sys": {"mac": "A8032ABE41FC", "restart_required": false, "uptime": 40210, "ram_size": 246136, "ram_free": 150000},
 "wifi": {"sta_ip": "192.168.2.16", "status": "got ip", "ssid": "lab", "rssi": -59}
}`

// fakeShelly serves both API shapes. Cloud behaviour is chosen by the
// device id; local behaviour by the first path segment of the address.
func fakeShelly(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /device/status", func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		key := r.PostForm.Get("auth_key")
		id := r.PostForm.Get("id")
		w.Header().Set("Content-Type", "application/json")
		if key != canaryKey {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"isok":false,"errors":{"unauthorized":"auth_key %s is not valid"}}`, key)
			return
		}
		switch id {
		case "ok":
			fmt.Fprintf(w, `{"isok":true,"data":{"online":true,"device_status":%s}}`,
				strings.Replace(gen2Status, `"ble"`, `"_updated":"2026-11-30 00:00:00","ble"`, 1))
		case "offline":
			fmt.Fprint(w, `{"isok":true,"data":{"online":false,"device_status":{"_updated":"2026-11-01 10:00:00","wifi_sta":{"connected":true,"ssid":"lab","rssi":-71},"meters":[{"power":0}],"tmp":{"tC":30.5}}}}`)
		case "gen1":
			fmt.Fprint(w, `{"isok":true,"data":{"online":true,"device_status":{"relays":[{"ison":true}],"meters":[{"power":10.5},{"power":2}],"tmp":{"tC":55.1},"wifi_sta":{"rssi":-48,"ssid":"x"}}}}`)
		case "notfound":
			fmt.Fprintf(w, `{"isok":false,"errors":{"device_not_found":"no device for key %s"}}`, key)
		case "500":
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "internal error while handling auth_key=%s", key)
		case "html":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, "<html><body>Maintenance. key=%s</body></html>", key)
		case "slow":
			<-r.Context().Done()
		default:
			fmt.Fprint(w, `{"isok":false,"errors":{"device_not_found":"device_not_found"}}`)
		}
	})
	mux.HandleFunc("GET /{mode}/rpc/Shelly.GetStatus", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("mode") {
		case "ok":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, gen2Status)
		case "500":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "html":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html>router login</html>")
		case "auth":
			w.WriteHeader(http.StatusUnauthorized)
		case "slow":
			<-r.Context().Done()
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// closedAddr is an address nothing listens on: an offline local device.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func node(t *testing.T, src string) yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	return *doc.Content[0]
}

type testEnv struct {
	env  connector.Env
	logs *bytes.Buffer
}

func newEnv(t *testing.T, cfg string, secrets map[string]string) testEnv {
	t.Helper()
	logs := &bytes.Buffer{}
	return testEnv{logs: logs, env: connector.Env{
		Name:   "shelly",
		Config: node(t, cfg),
		Secrets: connector.NewSecrets(func(n string) (string, bool) {
			v, ok := secrets[n]
			return v, ok
		}),
		HTTP: &http.Client{},
		Log:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}}
}

func TestStatus(t *testing.T) {
	srv := fakeShelly(t)
	cloud := func(name, id, env string) string {
		return fmt.Sprintf("  - {name: %s, mode: cloud, id: %q, server: %s, auth_key_env: %s}\n", name, id, srv.URL, env)
	}
	local := func(name, addr string) string {
		return fmt.Sprintf("  - {name: %s, mode: local, address: %s}\n", name, addr)
	}
	cfg := "timeout: 300ms\ndevices:\n" +
		cloud("c-ok", "ok", "KEY") + cloud("c-offline", "offline", "KEY") + cloud("c-gen1", "gen1", "KEY") +
		cloud("c-notfound", "notfound", "KEY") + cloud("c-500", "500", "KEY") + cloud("c-html", "html", "KEY") +
		cloud("c-slow", "slow", "KEY") + cloud("c-badkey", "ok", "BADKEY") + cloud("c-nokey", "ok", "UNSET_KEY") +
		local("l-ok", srv.URL+"/ok") + local("l-500", srv.URL+"/500") + local("l-html", srv.URL+"/html") +
		local("l-auth", srv.URL+"/auth") + local("l-slow", srv.URL+"/slow") + local("l-offline", closedAddr(t))
	te := newEnv(t, cfg, map[string]string{"KEY": canaryKey, "BADKEY": "wrong-" + canaryKey})
	tools, err := (&builder{}).Build(te.env)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if len(tools) != 1 {
		t.Fatalf("got %d tools, want 1", len(tools))
	}
	tool := tools[0]

	f := func(v float64) *float64 { return &v }
	tests := []struct {
		device  string
		wantErr string // substring; empty: success
		online  bool
		power   *float64
		temp    *float64
		rssi    *float64
	}{
		{device: "c-ok", online: true, power: f(123.4), temp: f(41.7), rssi: f(-59)},
		{device: "c-offline", online: false, power: f(0), temp: f(30.5), rssi: f(-71)},
		{device: "c-gen1", online: true, power: f(12.5), temp: f(55.1), rssi: f(-48)},
		{device: "c-notfound", wantErr: "device 'c-notfound': Shelly Cloud refused the request: device_not_found"},
		{device: "c-500", wantErr: "HTTP 500"},
		{device: "c-html", wantErr: "not JSON"},
		{device: "c-slow", wantErr: "timed out after 300ms"},
		{device: "c-badkey", wantErr: "rejected the auth key in BADKEY (HTTP 401)"},
		{device: "c-nokey", wantErr: "UNSET_KEY"},
		{device: "l-ok", online: true, power: f(123.4), temp: f(41.7), rssi: f(-59)},
		{device: "l-500", wantErr: "answered HTTP 500"},
		{device: "l-html", wantErr: "not JSON"},
		{device: "l-auth", wantErr: "requires authentication"},
		{device: "l-slow", wantErr: "'l-slow' is offline or unreachable at its configured address: timed out"},
		{device: "l-offline", wantErr: "'l-offline' is offline or unreachable"},
		{device: "nope", wantErr: `unknown device "nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.device, func(t *testing.T) {
			res, err := tool.Handler(context.Background(), connector.Args{"device": tc.device})
			out, _ := json.Marshal(res)
			if err != nil && strings.Contains(err.Error(), "wrong-") {
				t.Errorf("error leaks the bad key: %v", err)
			}
			for _, s := range []string{string(out), fmt.Sprint(err), te.logs.String()} {
				if strings.Contains(s, canaryKey) {
					t.Fatalf("auth key leaked: %s", s)
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			st := res.(*Status)
			if st.Device != tc.device || st.Online != tc.online {
				t.Errorf("device/online = %s/%v, want %s/%v", st.Device, st.Online, tc.device, tc.online)
			}
			eq := func(what string, got, want *float64) {
				if (got == nil) != (want == nil) || (got != nil && *got != *want) {
					t.Errorf("%s = %v, want %v", what, deref(got), deref(want))
				}
			}
			eq("power_w", st.PowerW, tc.power)
			eq("temperature_c", st.TemperatureC, tc.temp)
			eq("wifi_rssi", st.WifiRSSI, tc.rssi)
			if len(st.Raw) == 0 {
				t.Errorf("raw status subset is empty")
			}
		})
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestMissingSecretIsTyped(t *testing.T) {
	srv := fakeShelly(t)
	te := newEnv(t, fmt.Sprintf("devices:\n  - {name: a, mode: cloud, id: ok, server: %s, auth_key_env: SHELLY_KEY}\n", srv.URL), nil)
	tools, err := (&builder{}).Build(te.env)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tools[0].Handler(context.Background(), connector.Args{"device": "a"})
	var ms *connector.MissingSecretError
	if !errors.As(err, &ms) || ms.Name != "SHELLY_KEY" {
		t.Fatalf("err = %v, want *MissingSecretError{SHELLY_KEY}", err)
	}
}

func TestToolDefinition(t *testing.T) {
	te := newEnv(t, "devices:\n  - {name: b, mode: local, address: http://10.0.0.2}\n  - {name: a, mode: local, address: http://10.0.0.3}\n", nil)
	tools, err := (&builder{}).Build(te.env)
	if err != nil {
		t.Fatal(err)
	}
	def := tools[0].Def
	if def.Name != ToolName || !strings.HasPrefix(def.Name, "shelly_") {
		t.Errorf("name = %q", def.Name)
	}
	a := def.Annotations
	if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
		t.Errorf("annotations = %+v, want readOnly true, destructive false", a)
	}
	prop, _ := def.InputSchema.Properties["device"].(map[string]any)
	enum, _ := prop["enum"].([]string)
	if strings.Join(enum, ",") != "b,a" {
		t.Errorf("device enum = %v, want [b a]", prop["enum"])
	}
	if tg := tools[0].Targets; tg == nil || tg.Param != "device" || strings.Join(tg.Values, ",") != "b,a" {
		t.Errorf("targets = %+v", tg)
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct{ name, cfg, want string }{
		{"no devices", "devices: []\n", "at least one device"},
		{"empty name", "devices:\n  - {name: '', mode: local, address: http://x}\n", "devices[0].name: must not be empty"},
		{"duplicate", "devices:\n  - {name: a, mode: local, address: http://x}\n  - {name: a, mode: local, address: http://y}\n", "duplicate device name"},
		{"bad mode", "devices:\n  - {name: a, mode: mqtt}\n", `"mqtt" is not cloud or local`},
		{"relative address", "devices:\n  - {name: a, mode: local, address: 192.168.1.5}\n", "not an absolute http(s) URL"},
		{"relative server", "devices:\n  - {name: a, mode: cloud, id: x, server: shelly-1-eu.shelly.cloud, auth_key_env: K}\n", "server"},
		{"no id", "devices:\n  - {name: a, mode: cloud, server: https://s, auth_key_env: K}\n", "needs the Shelly Cloud device id"},
		{"no key env", "devices:\n  - {name: a, mode: cloud, id: x, server: https://s}\n", "auth_key_env"},
		{"password", "devices:\n  - {name: a, mode: local, address: http://x, password_env: P}\n", "digest auth"},
		{"mixed", "devices:\n  - {name: a, mode: local, address: http://x, id: y}\n", "apply to mode cloud only"},
		{"unknown key", "devices:\n  - {name: a, mode: local, adress: http://x}\n", "adress"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			te := newEnv(t, tc.cfg, nil)
			_, err := (&builder{}).Build(te.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want containing %q", err, tc.want)
			}
		})
	}
}

func FuzzParseCloud(f *testing.F) {
	f.Add([]byte(`{"isok":true,"data":{"online":true,"device_status":` + gen2Status + `}}`))
	f.Add([]byte(`{"isok":false,"errors":{"wrong_credentials":"x"}}`))
	f.Add([]byte(`{"isok":false,"errors":["a","b"]}`))
	f.Add([]byte(`{"isok":true,"data":{"device_status":{"switch:0":{"apower":"x"},"meters":7}}}`))
	f.Add([]byte(`<html>`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseCloud(b)
		if err == nil && st == nil {
			t.Fatal("nil status without error")
		}
	})
}

func FuzzParseLocal(f *testing.F) {
	f.Add([]byte(gen2Status))
	f.Add([]byte(`{"id":1,"result":` + gen2Status + `}`))
	f.Add([]byte(`{"id":1,"error":{"code":401,"message":"unauthorized"}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"result":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseLocal(b)
		if err == nil && (st == nil || !st.Online) {
			t.Fatal("successful parse must give an online status")
		}
	})
}
