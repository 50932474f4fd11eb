package config

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gpuhost/internal/exitclass"
)

func TestExampleAndDemoConfigsLoad(t *testing.T) {
	cfg, err := Parse("gpuhost.example.yaml", Example)
	if err != nil {
		t.Fatalf("example config: %v", err)
	}
	if got := cfg.ProfileNames(); strings.Join(got, ",") != "gemma3-27b,llama3-8b,qwen3-coder" {
		t.Errorf("example profiles = %v", got)
	}
	q := cfg.Profiles["qwen3-coder"]
	if q.VLLM.GPUMemoryUtilization != 0.92 || q.VLLM.MaxNumSeqs != 32 || q.VLLM.ToolCallParser != "qwen3_xml" || !q.VLLM.EnableAutoToolChoice {
		t.Errorf("qwen3-coder profile lost its known-good flags: %+v", q.VLLM)
	}
	if cfg.Listen != "127.0.0.1:8080" || !cfg.IsLoopback() {
		t.Errorf("listen = %q", cfg.Listen)
	}
	d, err := Demo("/usr/local/bin/gpuhost", "/var/lib/x", "127.0.0.1:9999")
	if err != nil {
		t.Fatalf("demo config: %v", err)
	}
	if d.Systemd.Runner != "process" || d.GPU.Backend != "sim" || d.Backends.VLLM.Exec[0] != "/usr/local/bin/gpuhost" || !d.Backends.VLLM.Simulated {
		t.Errorf("demo config wiring wrong: %+v %+v", d.Systemd, d.Backends.VLLM)
	}
	if d.GPU.SimDir != "/var/lib/x/simgpu" {
		t.Errorf("sim dir = %q", d.GPU.SimDir)
	}
}

const minimal = `
state_dir: /var/lib/gpuhost
profiles:
  p1:
    backend: vllm
    model: org/model
    port: 8000
`

func TestConfigErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings that must all appear
	}{
		{"unknown top-level key", minimal + "listn: 1.2.3.4:80\n", []string{"listn (line", "unknown key", "known keys here:"}},
		{"unknown nested key", minimal + "    vllm:\n      gpu_memory_utilisation: 0.9\n", []string{"profiles.p1.vllm.gpu_memory_utilisation", "unknown key"}},
		{"wrong type", minimal + "    vllm:\n      max_num_seqs: many\n", []string{"profiles.p1.vllm.max_num_seqs (line", "cannot unmarshal"}},
		{"bad duration", minimal + "switch:\n  ready_timeout: soon\n", []string{"switch.ready_timeout", "invalid duration"}},
		{"bad backend", minimal + "gpu:\n  backend: cuda\n", []string{"gpu.backend", `"cuda"`}},
		{"bad listen", minimal + "listen: nowhere\n", []string{"listen (line 8):", "host:port"}},
		{"bad profile value", strings.Replace(minimal, "port: 8000", "port: 70000", 1), []string{"profiles.p1.port"}},
		{"bad utilisation", minimal + "    vllm:\n      gpu_memory_utilization: 1.5\n", []string{"profiles.p1.vllm.gpu_memory_utilization"}},
		{"unknown default profile", minimal + "default_profile: nope\n", []string{"default_profile", `"nope"`, "p1"}},
		{"no profiles", "state_dir: /x\n", []string{"profiles: at least one profile"}},
		{"relative exec", minimal + "backends:\n  vllm:\n    exec: [vllm]\n", []string{"backends.vllm.exec[0]", "absolute"}},
		{"same unit twice", minimal + "backends:\n  vllm:\n    unit: a.service\n  ollama:\n    unit: a.service\n", []string{"backends.ollama.unit", "same unit"}},
		{"invalid yaml", "profiles: [\n", []string{"invalid YAML"}},
		{"empty file", "", []string{"file is empty"}},
		{"bad profile name", strings.Replace(minimal, "p1:", "P 1:", 1), []string{"profiles.P 1"}},
		{"triage unknown key", minimal + "triage:\n  intervall: 5s\n", []string{"triage.intervall (line", "unknown key"}},
		{"triage source kind", minimal + "triage:\n  enabled: true\n  source: {kind: pop3}\n", []string{"triage.source.kind", `"pop3"`}},
		{"triage plain IMAP beyond loopback", minimal + "triage:\n  enabled: true\n  source: {kind: imap, addr: '10.0.0.5:143', security: plain, username: u, password_env: P}\n", []string{"triage.source.security", "loopback", "10.0.0.5"}},
		{"triage first_run", minimal + "triage:\n  first_run: some\n", []string{"triage.first_run", `"some"`}},
		{"triage threshold", minimal + "triage:\n  important_threshold: 11\n", []string{"triage.important_threshold", "1..10"}},
		{"triage priority mailbox", minimal + "triage:\n  rules: {priority_mailboxes: [support]}\n", []string{"triage.rules.priority_mailboxes[0]", `"support"`}},
		{"triage profile url", minimal + "triage:\n  crm: {enabled: true, profile_url: 'https://crm/x'}\n", []string{"triage.crm.profile_url", "{id}"}},
		{"triage crm match", minimal + "triage:\n  crm: {enabled: true, match: regex}\n", []string{"triage.crm.match", `"regex"`}},
		{"triage transcription count", minimal + "triage:\n  transcription: {max_per_mail: -1}\n", []string{"triage.transcription.max_per_mail", "negative"}},
		{"triage transcription seconds", minimal + "triage:\n  transcription: {max_seconds_per_mail: -5}\n", []string{"triage.transcription.max_seconds_per_mail", "negative"}},
		{"agent steps", minimal + "agent:\n  max_steps: 99\n", []string{"agent.max_steps", "1..50"}},
		{"activity log size", minimal + "panel:\n  activity_requests: -3\n", []string{"panel.activity_requests (line", "0..100000"}},
		{"negative drain", minimal + "proxy:\n  drain_timeout: -1s\n", []string{"proxy.drain_timeout (line", "negative"}},
		{"negative switch drain", minimal + "switch:\n  drain_timeout: -2s\n", []string{"switch.drain_timeout (line", "negative"}},
		{"bad residency", minimal + "proxy:\n  min_residency: often\n", []string{"proxy.min_residency (line", "invalid duration"}},
		{"drain beyond the hold", minimal + "proxy:\n  hold_timeout: 20s\n  drain_timeout: 1m\n", []string{"proxy.drain_timeout (line", "1m0s is longer than proxy.hold_timeout (20s)"}},
		{"bench results", minimal + "bench:\n  max_results: -5\n", []string{"bench.max_results (line", "-5 is too small"}},
		{"bench bytes", minimal + "bench:\n  max_bytes: 1000\n", []string{"bench.max_bytes (line", "1000 is too small"}},
		{"streams per client", minimal + "http:\n  max_streams_per_client: 5000\n", []string{"http.max_streams_per_client (line", "5000 is outside 1..http.max_connections (1024)"}},
		{"streams fill a client's connections", minimal + "http:\n  max_connections_per_client: 16\n  max_streams_per_client: 16\n", []string{"http.max_streams_per_client (line", "leaves no connection of http.max_connections_per_client (16)"}},
		{"decode memory below one request", minimal + "http:\n  decode_memory_bytes: 1048576\n", []string{"http.decode_memory_bytes (line", "smaller than one request at its bounds"}},
		{"write timeout", minimal + "http:\n  write_timeout: 10ms\n", []string{"http.write_timeout (line", "too short"}},
		{"mcp sessions", minimal + "mcp:\n  max_sessions: -1\n", []string{"mcp.max_sessions (line", "-1 is outside 1..1048576"}},
		{"bad backend network", minimal + "backends:\n  vllm:\n    network: closed\n", []string{"backends.vllm.network (line", `"closed" is not one of fenced, open`}},
		{"bad profile network", minimal + "    network: fenced\n", []string{"profiles.p1.network (line", `"fenced" is not one of offline, open`}},
		{"open profile in a fenced unit", minimal + "    network: open\n", []string{"profiles.p1.network (line", "open needs backends.vllm.network: open", "PrivateNetwork=yes"}},
		{"residency beyond the hold", minimal + "proxy:\n  hold_timeout: 20s\n  min_residency: 30s\n", []string{"proxy.min_residency (line", "30s is longer than proxy.hold_timeout (20s)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatal("want an error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config test.yaml: ") {
				t.Errorf("error does not name the file: %s", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := Parse("m.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Profiles["p1"]
	if p.Name != "p1" || p.ServedName != "org/model" {
		t.Errorf("profile defaults: name %q served %q", p.Name, p.ServedName)
	}
	if cfg.Backends.VLLM.Unit != "gpuhost-vllm.service" || cfg.Backends.Ollama.Unit != "gpuhost-ollama.service" {
		t.Errorf("unit defaults: %q %q", cfg.Backends.VLLM.Unit, cfg.Backends.Ollama.Unit)
	}
	if !*cfg.Switch.Rollback || cfg.Policy == nil {
		t.Error("rollback should default on and the policy to the default table")
	}
	bus := cfg.BackendUnits()
	if bus[0].Conflicts[0] != "gpuhost-ollama.service" || bus[1].Conflicts[0] != "gpuhost-vllm.service" {
		t.Errorf("conflicts not both ways: %+v", bus)
	}
	if got := cfg.EnvFilePath("gpuhost-vllm.service"); got != "/var/lib/gpuhost/backends/gpuhost-vllm.env" {
		t.Errorf("env file path %q", got)
	}
	if tr := cfg.Triage.Transcription; tr.MaxPerMail != 10 || tr.MaxSecondsPerMail != 900 {
		t.Errorf("triage.transcription max_per_mail %d, max_seconds_per_mail %d; want 10 and 900", tr.MaxPerMail, tr.MaxSecondsPerMail)
	}
	if d, r := cfg.Proxy.DrainTimeout.D(), cfg.Proxy.MinResidency.D(); d != DefaultDrainTimeout || r != DefaultMinResidency {
		t.Errorf("proxy drain_timeout %s, min_residency %s; want the defaults", d, r)
	}
	if d := cfg.Switch.DrainTimeout.D(); d != DefaultSwitchDrainTimeout {
		t.Errorf("switch.drain_timeout %s, want the default %s", d, DefaultSwitchDrainTimeout)
	}
	if cfg.Bench.MaxResults != DefaultBenchMaxResults || cfg.Bench.MaxBytes != DefaultBenchMaxBytes {
		t.Errorf("bench %+v, want the defaults", cfg.Bench)
	}
	if cfg.MCP.MaxSessions != DefaultMCPMaxSessions {
		t.Errorf("mcp.max_sessions %d, want %d", cfg.MCP.MaxSessions, DefaultMCPMaxSessions)
	}
}

// TestProxyPolicyKeys: 0 turns the anti-thrash bounds off (it is not "the
// default"), and unset they follow a hold_timeout shorter than their
// defaults, so that setting only hold_timeout is never an error.
func TestProxyPolicyKeys(t *testing.T) {
	for _, tc := range []struct {
		yaml                string
		wantDrain, wantStay string
	}{
		{"proxy:\n  drain_timeout: 0s\n  min_residency: 0s\n", "0s", "0s"},
		{"proxy:\n  drain_timeout: 5s\n  min_residency: 250ms\n", "5s", "250ms"},
		{"proxy:\n  hold_timeout: 4s\n", "4s", "4s"},
		{"proxy:\n  hold_timeout: 20s\n", "20s", "10s"},
	} {
		cfg, err := Parse("p.yaml", []byte(minimal+tc.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if d, r := cfg.Proxy.DrainTimeout.D().String(), cfg.Proxy.MinResidency.D().String(); d != tc.wantDrain || r != tc.wantStay {
			t.Errorf("%q: drain_timeout %s, min_residency %s; want %s, %s", tc.yaml, d, r, tc.wantDrain, tc.wantStay)
		}
	}
}

func TestLoadConfigMissingFileNamesIt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("want error naming %s, got %v", p, err)
	}
}

func TestAPITokenFileWins(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "tok")
	if err := os.WriteFile(f, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPUHOST_TEST_TOKEN", "from-env")
	cfg, err := Parse("t", []byte(minimal+"api_token_env: GPUHOST_TEST_TOKEN\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := cfg.APIToken(); tok != "from-env" {
		t.Errorf("token from env = %q", tok)
	}
	cfg.APITokenFile = f
	if tok, _ := cfg.APIToken(); tok != "s3cret" {
		t.Errorf("token from file = %q", tok)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add(Example)
	f.Add([]byte("profiles: {a: {backend: ollama, model: x, port: 1}}\nlisten: ':0'\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err == nil && cfg == nil {
			t.Fatal("nil config without error")
		}
		if err != nil && cfg != nil {
			t.Fatal("config and error both returned")
		}
	})
}

// telegram.api_url is parsed, not matched by prefix: the bot token travels
// in every request path, so a URL that reads as loopback but goes elsewhere
// must be refused, and real loopback addresses accepted.
func TestTelegramAPIURL(t *testing.T) {
	tests := []struct {
		url     string
		wantErr string // "" = accepted
	}{
		{"https://api.telegram.org", ""},
		{"https://tg-proxy.example.com:8443/botapi/", ""},
		{"http://127.0.0.1:8081", ""},
		{"http://127.0.0.2:8081", ""},
		{"http://[::1]:8081", ""},
		{"http://localhost:8081", ""},
		{"http://LOCALHOST", ""},
		{"http://127.0.0.1@example.com", "user info"},
		{"http://127.0.0.1:80@example.com/", "user info"},
		{"https://user:pw@api.telegram.org", "user info"},
		{"http://127.0.0.1.example.com", `not "127.0.0.1.example.com"`},
		{"http://localhost.example.com:8081", "loopback"},
		{"http://app.localhost:8081", "loopback"}, // DNS may answer it with any address
		{"http://10.0.0.5:8081", "loopback"},
		{"http://[::ffff:10.0.0.5]:8081", "loopback"},
		{"http://api.telegram.org", "must be https"},
		{"ftp://127.0.0.1", "must be an https:// URL"},
		{"api.telegram.org", "must be an https:// URL"},
		{"https://", "no host"},
		{"https://:443", "no host"},
		{"http://127.0.0.1:99999", "invalid port"},
		{"https://api.telegram.org?x=1", "query"},
		{"https://api.telegram.org#frag", "fragment"},
		{"http://127.0.0.1\n.example.com", "not a URL"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			y := minimal + "telegram:\n  api_url: " + strconv.Quote(tt.url) + "\n"
			_, err := Parse("test.yaml", []byte(y))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range []string{"telegram.api_url", tt.wantErr} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestDemoConfigMovesBusyPorts: a second demo finds the first one's backend
// ports taken and uses free ones; profiles that shared a port still do.
func TestDemoConfigMovesBusyPorts(t *testing.T) {
	first, err := Demo("/usr/local/bin/gpuhost", t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	vllmPort := first.Profiles["qwen3-coder"].Port
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(vllmPort))
	if err != nil {
		t.Skipf("port %d is taken by someone else already: %v", vllmPort, err)
	}
	defer ln.Close()
	second, err := Demo("/usr/local/bin/gpuhost", t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	moved := second.Profiles["qwen3-coder"].Port
	if moved == vllmPort || moved == 0 {
		t.Fatalf("qwen3-coder kept the busy port %d", vllmPort)
	}
	if g := second.Profiles["gemma3-27b"].Port; g != moved {
		t.Errorf("gemma3-27b port %d, want the shared vLLM port %d", g, moved)
	}
	// The Ollama port is not compared with the first call's: a demo in a
	// test running beside this one may take or free it in between. It must
	// not collide with the moved vLLM port, and moves only if it was busy.
	if o := second.Profiles["llama3-8b"].Port; o == moved || o == vllmPort {
		t.Errorf("the Ollama port %d collides with the vLLM ports %d/%d", o, vllmPort, moved)
	}
	// Moves are keyed by the configured port; the first call may have
	// moved it already (a demo beside this test holds it).
	configured := vllmPort
	for from, to := range first.DemoPortMoves {
		if to == vllmPort {
			configured = from
		}
	}
	if second.DemoPortMoves[configured] != moved {
		t.Errorf("moves = %v, want %d→%d", second.DemoPortMoves, configured, moved)
	}
}

// TestTriagePlainIMAP: security plain (no TLS) only to a loopback IP or
// localhost in any case (loopback.DialsLoopback), never to a name under
// .localhost, which DNS may answer with any address.
func TestTriagePlainIMAP(t *testing.T) {
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:143", true},
		{"[::1]:143", true},
		{"localhost:143", true},
		{"LOCALHOST:143", true},
		{"mail.localhost:143", false},
		{"10.0.0.5:143", false},
	} {
		y := minimal + "triage:\n  enabled: true\n  source: {kind: imap, addr: '" + tt.addr + "', security: plain, username: u, password_env: P}\n"
		_, err := Parse("test.yaml", []byte(y))
		if tt.ok && err != nil {
			t.Errorf("%s: %v", tt.addr, err)
		}
		if !tt.ok && (err == nil || !strings.Contains(err.Error(), "triage.source.security") || !strings.Contains(err.Error(), "loopback")) {
			t.Errorf("%s: err = %v, want the plain-only-to-loopback refusal", tt.addr, err)
		}
	}
}

// TestCheckToken: a public listen without a token, a short token and an
// api_token_file that cannot be read are configuration errors (*Error,
// exit 78) naming the key and its line; a loopback listen needs no token.
func TestCheckToken(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	long := filepath.Join(dir, "long")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(long, []byte(strings.Repeat("k", MinTokenLength)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPUHOST_TEST_NO_TOKEN", "")
	public := "listen: 0.0.0.0:8080" + minimal + "api_token_env: GPUHOST_TEST_NO_TOKEN\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"loopback without a token", minimal, ""},
		{"loopback with a missing token file", minimal + "api_token_file: " + filepath.Join(dir, "gone") + "\n", "api_token_file (line 8)"},
		{"public without a token", public, "listen (line 1)"},
		{"public with a missing token file", public + "api_token_file: " + filepath.Join(dir, "gone") + "\n", "api_token_file (line 9)"},
		{"public with a short token", public + "api_token_file: " + short + "\n", "api_token_file (line 9): the bearer token in api_token_file " + short + " has 3 characters"},
		{"public with a long token", public + "api_token_file: " + long + "\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("t.yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			err = cfg.CheckToken()
			var ce *Error
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("CheckToken = %v, want nil", err)
			case tt.want != "" && (!errors.As(err, &ce) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("CheckToken = %v (%T), want a *config.Error containing %q", err, err, tt.want)
			}
		})
	}
}

// TestDemoPublicListenNeedsToken: a demo beyond loopback without a token
// long enough is a config error (exit 78), refused before any port is
// probed; with one it is accepted.
func TestDemoPublicListenNeedsToken(t *testing.T) {
	t.Setenv("GPUHOST_API_TOKEN", "")
	_, err := Demo("/usr/local/bin/gpuhost", t.TempDir(), "0.0.0.0:8099")
	var ce *Error
	if !errors.As(err, &ce) || exitclass.Of(err) != 78 || !strings.Contains(err.Error(), "--listen 0.0.0.0:8099 is not loopback") {
		t.Errorf("no token: %v (exit %d), want a config error naming --listen", err, exitclass.Of(err))
	}
	t.Setenv("GPUHOST_API_TOKEN", "short")
	if _, err := Demo("/usr/local/bin/gpuhost", t.TempDir(), "0.0.0.0:8099"); exitclass.Of(err) != 78 || !strings.Contains(err.Error(), "5 characters") {
		t.Errorf("short token: %v", err)
	}
	t.Setenv("GPUHOST_API_TOKEN", strings.Repeat("x", MinTokenLength))
	if _, err := Demo("/usr/local/bin/gpuhost", t.TempDir(), "0.0.0.0:8099"); err != nil {
		t.Errorf("with a token: %v", err)
	}
}
