package units

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func vllmUnit() BackendUnit {
	return BackendUnit{
		Backend:   VLLM,
		Name:      "gpuhost-vllm.service",
		Exec:      []string{"/usr/local/bin/vllm"},
		EnvFile:   "/var/lib/gpuhost/vllm.env",
		User:      "vllm",
		Conflicts: []string{"gpuhost-ollama.service"},
	}
}

func simUnit() BackendUnit {
	return BackendUnit{
		Backend:   Ollama,
		Name:      "gpuhost-ollama.service",
		Exec:      []string{"/usr/local/bin/gpuhost", "simulate", "ollama", "--sim-dir", "/var/lib/gpuhost/simgpu"},
		EnvFile:   "/var/lib/gpuhost/ollama.env",
		Conflicts: []string{"gpuhost-vllm.service", "vllm.service"},
	}
}

// mustParse parses a rendered unit and fails on warnings too: gpuhost's own
// files must be clean.
func mustParse(t *testing.T, text string) UnitFile {
	t.Helper()
	uf, err := ParseUnitFile(text)
	if err != nil {
		t.Fatalf("ParseUnitFile: %v\n%s", err, text)
	}
	if len(uf.Warnings) > 0 {
		t.Fatalf("ParseUnitFile warnings %q\n%s", uf.Warnings, text)
	}
	return uf
}

func wantValue(t *testing.T, uf UnitFile, section, key, want string) {
	t.Helper()
	got, ok := uf.Value(section, key)
	if !ok || got != want {
		t.Errorf("[%s] %s = %q (present %v), want %q", section, key, got, ok, want)
	}
}

func TestRenderBackendUnit(t *testing.T) {
	odd := vllmUnit()
	odd.Exec = []string{"/opt/my models/bin/vllm", "100%", "$HOME", `say "hi"`, "back\\slash", ";", ""}
	odd.User = ""

	for _, u := range []BackendUnit{vllmUnit(), simUnit(), odd} {
		t.Run(u.Name+"/"+u.Exec[0], func(t *testing.T) {
			if err := u.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			text := RenderBackendUnit(u)
			uf := mustParse(t, text)
			if got := uf.List("Unit", "Conflicts"); !slices.Equal(got, u.Conflicts) {
				t.Errorf("Conflicts = %q, want %q", got, u.Conflicts)
			}
			wantValue(t, uf, "Unit", "After", "network-online.target")
			wantValue(t, uf, "Service", "Type", "exec")
			wantValue(t, uf, "Service", "EnvironmentFile", "-"+u.EnvFile)
			wantValue(t, uf, "Service", "KillMode", "control-group")
			wantValue(t, uf, "Service", "TimeoutStopSec", "30")
			wantValue(t, uf, "Service", "Restart", "no")
			if u.User != "" {
				wantValue(t, uf, "Service", "User", u.User)
			} else if _, ok := uf.Value("Service", "User"); ok {
				t.Error("User= rendered although none was asked for")
			}
			if d, _ := uf.Value("Unit", "Description"); d == "" {
				t.Error("no Description")
			}
			es, _ := uf.Value("Service", "ExecStart")
			argv, err := SplitExecStart(es)
			if err != nil {
				t.Fatalf("SplitExecStart(%q): %v", es, err)
			}
			if want := append(slices.Clone(u.Exec), "$"+EnvArgs); !slices.Equal(argv, want) {
				t.Errorf("ExecStart %q splits to %q, want %q", es, argv, want)
			}
			for _, s := range uf.Sections {
				if s.Name == "Install" {
					t.Error("backend unit has an [Install] section; gpuhost starts it, nothing should enable it")
				}
			}
		})
	}
}

func TestRenderAdoptDropIn(t *testing.T) {
	u := BackendUnit{Backend: VLLM, Name: "vllm.service", Adopt: true, Conflicts: []string{"gpuhost-ollama.service", "ollama.service"}}
	if err := u.Validate(); err != nil {
		t.Fatalf("Validate of an adopted unit (no exec, no env file needed): %v", err)
	}
	path, content := RenderAdoptDropIn(u)
	if path != "vllm.service.d/10-gpuhost.conf" {
		t.Errorf("path = %q", path)
	}
	if !strings.Contains(content, "gpuhost") || !strings.Contains(content, "untouched") {
		t.Errorf("header must say gpuhost wrote it and the operator's unit is untouched:\n%s", content)
	}
	uf := mustParse(t, content)
	if len(uf.Sections) != 1 || uf.Sections[0].Name != "Unit" || len(uf.Sections[0].Entries) != 2 {
		t.Fatalf("drop-in must hold [Unit] Conflicts= and After= only, got %+v", uf.Sections)
	}
	if got := uf.List("Unit", "Conflicts"); !slices.Equal(got, u.Conflicts) {
		t.Errorf("Conflicts = %q, want %q", got, u.Conflicts)
	}
	if got := uf.List("Unit", "After"); !slices.Equal(got, u.Conflicts) {
		t.Errorf("After = %q, want %q (ordering makes the stop finish before the start)", got, u.Conflicts)
	}
}

func TestRenderDaemonUnit(t *testing.T) {
	tests := []struct {
		name        string
		d           DaemonUnit
		watchdog    string
		protectHome string
		rw          string
	}{
		{"defaults", DaemonUnit{Binary: "/usr/local/bin/gpuhost", Config: "/etc/gpuhost/config.yaml"}, "30", "yes",
			"/etc/systemd/system -/run/systemd/system"},
		{"custom", DaemonUnit{Binary: "/usr/local/bin/gpuhost", Config: "/etc/gpuhost/my config.yaml", WatchdogSec: 10, User: "gpuhost",
			ReadWritePaths: []string{"/srv/gpuhost-env"}}, "10", "yes",
			"/etc/systemd/system -/run/systemd/system /srv/gpuhost-env"},
		{"config in a home dir", DaemonUnit{Binary: "/usr/local/bin/gpuhost", Config: "/home/op/gpuhost.yaml"}, "30", "read-only",
			"/etc/systemd/system -/run/systemd/system"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.d.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			uf := mustParse(t, RenderDaemonUnit(tc.d))
			es, _ := uf.Value("Service", "ExecStart")
			argv, err := SplitExecStart(es)
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{tc.d.Binary, "serve", "--config", tc.d.Config}; !slices.Equal(argv, want) {
				t.Errorf("ExecStart splits to %q, want %q", argv, want)
			}
			for _, kv := range [][2]string{
				{"Type", "notify"}, {"NotifyAccess", "main"}, {"WatchdogSec", tc.watchdog}, {"Restart", "on-failure"},
				{"RestartSec", "2"}, {"StateDirectory", "gpuhost"}, {"ConfigurationDirectory", "gpuhost"},
				{"NoNewPrivileges", "yes"}, {"ProtectSystem", "strict"}, {"ReadWritePaths", tc.rw},
				{"ProtectHome", tc.protectHome}, {"PrivateTmp", "yes"}, {"ProtectKernelTunables", "yes"},
				{"ProtectKernelModules", "yes"}, {"ProtectControlGroups", "yes"}, {"LockPersonality", "yes"},
				{"RestrictRealtime", "yes"}, {"RestrictSUIDSGID", "yes"},
			} {
				wantValue(t, uf, "Service", kv[0], kv[1])
			}
			// Settings that would cut gpuhost off from NVML, D-Bus or /proc.
			for _, k := range []string{"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "ProtectProc", "ProcSubset", "PrivateNetwork"} {
				if v, ok := uf.Value("Service", k); ok {
					t.Errorf("%s=%s is set; it breaks NVML, D-Bus or /proc access", k, v)
				}
			}
			fams := uf.List("Service", "RestrictAddressFamilies")
			for _, f := range []string{"AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"} {
				if !slices.Contains(fams, f) {
					t.Errorf("RestrictAddressFamilies %q lacks %s", fams, f)
				}
			}
			if tc.d.User != "" {
				wantValue(t, uf, "Service", "User", tc.d.User)
			}
			wantValue(t, uf, "Install", "WantedBy", "multi-user.target")
		})
	}
}

func TestBackendUnitValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*BackendUnit)
		want string // substring of the error; "" = valid
	}{
		{"valid", func(*BackendUnit) {}, ""},
		{"bad backend", func(u *BackendUnit) { u.Backend = "tgi" }, "unknown backend"},
		{"name without suffix", func(u *BackendUnit) { u.Name = "gpuhost-vllm" }, "suffix"},
		{"name not a service", func(u *BackendUnit) { u.Name = "gpuhost-vllm.socket" }, ".service"},
		{"name with space", func(u *BackendUnit) { u.Name = "gpu host.service" }, "contains"},
		{"conflicts itself", func(u *BackendUnit) { u.Conflicts = []string{u.Name} }, "itself"},
		{"conflict invalid", func(u *BackendUnit) { u.Conflicts = []string{"a b.service"} }, "conflicts"},
		{"no exec", func(u *BackendUnit) { u.Exec = nil }, "exec"},
		{"exec prefix char", func(u *BackendUnit) { u.Exec = []string{"-/usr/bin/vllm"} }, "prefixes"},
		{"exec NUL", func(u *BackendUnit) { u.Exec = []string{"/bin/x", "a\x00b"} }, "NUL"},
		{"exec newline", func(u *BackendUnit) { u.Exec = []string{"/bin/x", "a\nExecStartPre=/bin/evil"} }, "control character"},
		{"exec escape", func(u *BackendUnit) { u.Exec = []string{"/bin/x", "a\x1b[2J"} }, "control character"},
		{"name with newline", func(u *BackendUnit) { u.Name = "a\nUser=root.service" }, "contains"},
		{"template name", func(u *BackendUnit) { u.Name = "gpuhost-vllm@.service" }, "template"},
		{"user with newline", func(u *BackendUnit) { u.User = "x\nExecStartPre=/bin/evil" }, "user"},
		{"upper-case user", func(u *BackendUnit) { u.User = "Root" }, "user"},
		{"user starting with a digit", func(u *BackendUnit) { u.User = "1abc" }, "user"},
		{"numeric UID", func(u *BackendUnit) { u.User = "1001" }, ""},
		{"relative env file", func(u *BackendUnit) { u.EnvFile = "vllm.env" }, "absolute"},
		{"unclean env file", func(u *BackendUnit) { u.EnvFile = "/var/lib/../x.env" }, "clean"},
		{"env file with newline", func(u *BackendUnit) { u.EnvFile = "/var/x\n.env" }, "control"},
		{"bad user", func(u *BackendUnit) { u.User = "a b" }, "user"},
		{"adopted needs no exec", func(u *BackendUnit) { u.Adopt = true; u.Exec = nil; u.EnvFile = "" }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := vllmUnit()
			tc.mod(&u)
			err := u.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestDaemonUnitValidate(t *testing.T) {
	good := DaemonUnit{Binary: "/usr/local/bin/gpuhost", Config: "/etc/gpuhost/config.yaml"}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v", good, err)
	}
	for _, bad := range []DaemonUnit{
		{Binary: "gpuhost", Config: "/etc/gpuhost/config.yaml"},
		{Binary: "/usr/local/bin/gpuhost", Config: "config.yaml"},
		{Binary: "/usr/local/bin/gpuhost", Config: "/etc/c.yaml", ReadWritePaths: []string{"/a b"}},
		{Binary: "/usr/local/bin/gpuhost", Config: "/etc/c.yaml", ReadWritePaths: []string{"rel"}},
		{Binary: "/usr/local/bin/gpuhost", Config: "/etc/c.yaml", User: "-x"},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", bad)
		}
	}
}

func TestSplitExecStart(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		err  string
	}{
		{in: "/usr/bin/vllm serve M", want: []string{"/usr/bin/vllm", "serve", "M"}},
		{in: `  /bin/x  "a b"  'c d'  e `, want: []string{"/bin/x", "a b", "c d", "e"}},
		{in: `/bin/x e\ f`, err: "unknown escape"}, // systemd 252 warns "Ignoring unknown escape sequences"
		{in: `/bin/x "q\"x" \x41\101\u00e4 \s \;`, want: []string{"/bin/x", `q"x`, "AAä", " ", ";"}},
		{in: `/bin/x 100%% $$HOME $GPUHOST_ARGS %n`, want: []string{"/bin/x", "100%", "$HOME", "$GPUHOST_ARGS", "%n"}},
		{in: `-/usr/bin/vllm serve`, want: []string{"/usr/bin/vllm", "serve"}},
		{in: `!!+/usr/bin/vllm serve`, want: []string{"/usr/bin/vllm", "serve"}},
		{in: `@/usr/bin/python3 vllm-main -m x`, want: []string{"/usr/bin/python3", "-m", "x"}},
		{in: `/bin/x a"b c"d`, want: []string{"/bin/x", "ab cd"}},
		{in: `/bin/x ";"`, want: []string{"/bin/x", ";"}},
		{in: `/bin/x ; /bin/y`, err: "more than one command"},
		{in: `/bin/x "open`, err: "unterminated"},
		{in: `/bin/x \q`, err: "unknown escape"},
		{in: `/bin/x \x00`, err: "NUL"},
		{in: `/bin/x \`, err: "backslash at end"},
		{in: `/bin/x \xZZ`, err: "bad"},
		{in: "   ", err: "no command"},
		{in: "-", err: "no program"},
		{in: "/bin/x a\x00b", err: "NUL"},
	}
	for _, tc := range tests {
		got, err := SplitExecStart(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("SplitExecStart(%q) = %q, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("SplitExecStart(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func FuzzSplitExecStart(f *testing.F) {
	f.Add(`/bin/x "a b" 'c' \x41 %% $$`)
	f.Add(`@-/bin/x y ; z`)
	f.Add("/bin/x \"unterminated")
	f.Fuzz(func(t *testing.T, s string) {
		argv, err := SplitExecStart(s)
		if err != nil {
			return
		}
		// Quoting what we read and reading it again is stable.
		line := make([]string, len(argv))
		for i, w := range argv {
			line[i] = QuoteExecWord(w)
		}
		if strings.ContainsAny(argv[0][:1], "@-:+!") {
			return // a prefix char survives as data only when escaped; not reproducible from argv
		}
		again, err := SplitExecStart(strings.Join(line, " "))
		if err != nil {
			t.Fatalf("re-splitting %q: %v", line, err)
		}
		if !slices.Equal(again, argv) {
			t.Fatalf("re-split %q = %q, want %q", line, again, argv)
		}
	})
}

func FuzzQuoteExecWord(f *testing.F) {
	for _, s := range []string{"", "plain", "a b", `"`, `\`, "%", "$", "%%$$", ";", "\n\t\r\x01\x7f", "\xff\xfe", "ä ö"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, w string) {
		w = strings.ReplaceAll(w, "\x00", "")
		line := "/bin/prog " + QuoteExecWord(w)
		argv, err := SplitExecStart(line)
		if err != nil {
			t.Fatalf("SplitExecStart(%q): %v", line, err)
		}
		if want := []string{"/bin/prog", w}; !slices.Equal(argv, want) {
			t.Fatalf("QuoteExecWord(%q) = %q reads back as %q", w, QuoteExecWord(w), argv)
		}
	})
}

// TestSystemdAnalyzeVerify has the real systemd check the rendered files.
// It is skipped where systemd-analyze is not installed.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	dir := t.TempDir()
	envFile := filepath.Join(dir, "backend.env")
	if err := os.WriteFile(envFile, []byte(EnvFile(qwenCoder(), true)), 0o600); err != nil {
		t.Fatal(err)
	}
	u := vllmUnit()
	u.Exec = []string{"/bin/echo", "100%", "$HOME", `say "hi" \ there`}
	u.EnvFile = envFile
	u.User = ""
	u.Ports = []int{8000, 8001}
	files := map[string]string{
		"gpuhost-vllm.service": RenderBackendUnit(u),
		"gpuhost.service":      RenderDaemonUnit(DaemonUnit{Binary: "/bin/true", Config: envFile, Sockets: u.ProxySocketUnits()}),
	}
	for _, f := range RenderProxyUnits(u) {
		files[f.Name] = f.Content
	}
	if len(files) != 6 {
		t.Fatalf("want the backend, the daemon and two socket/service pairs, got %d files", len(files))
	}
	var paths []string
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	dropDir := filepath.Join(dir, "gpuhost-vllm.service.d")
	if err := os.Mkdir(dropDir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, dropIn := RenderAdoptDropIn(u)
	if err := os.WriteFile(filepath.Join(dropDir, DropInName), []byte(dropIn), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sa, append([]string{"verify", "--man=no"}, paths...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// verify exits 0 on warnings; any line about our files is a problem.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, dir) || strings.Contains(line, "gpuhost") {
			t.Errorf("systemd-analyze: %s", line)
		}
	}
}

// TestBackendUnitSandbox: the backend's writable folders are exactly its
// ReadWritePaths (optional, '-'), /tmp and home directories are only opened
// as far as the program or a writable folder needs, and device access stays
// open for /dev/nvidia*.
func TestBackendUnitSandbox(t *testing.T) {
	tests := []struct {
		name                     string
		exec                     string
		rw                       []string
		wantRW                   string // "" = no ReadWritePaths=
		wantPrivateTmp, wantHome string
	}{
		{"default", "/usr/local/bin/vllm", []string{DefaultBackendHome}, "-" + DefaultBackendHome, "yes", "yes"},
		{"no writable folders", "/usr/local/bin/vllm", nil, "", "yes", "yes"},
		{"models in a home", "/usr/local/bin/vllm", []string{"/home/op/models", "/srv/hf%cache"}, "-/home/op/models -/srv/hf%%cache", "yes", "read-only"},
		{"program under /tmp", "/tmp/x/vllm", []string{"/srv/models"}, "-/srv/models", "no", "yes"},
		{"writable folder under /var/tmp", "/usr/bin/vllm", []string{"/var/tmp/cache"}, "-/var/tmp/cache", "no", "yes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := vllmUnit()
			u.Exec, u.ReadWritePaths = []string{tc.exec}, tc.rw
			if err := u.Validate(); err != nil {
				t.Fatal(err)
			}
			uf := mustParse(t, RenderBackendUnit(u))
			if tc.wantRW == "" {
				if v, ok := uf.Value("Service", "ReadWritePaths"); ok {
					t.Errorf("ReadWritePaths=%s, want none", v)
				}
			} else {
				wantValue(t, uf, "Service", "ReadWritePaths", tc.wantRW)
			}
			wantValue(t, uf, "Service", "PrivateTmp", tc.wantPrivateTmp)
			wantValue(t, uf, "Service", "ProtectHome", tc.wantHome)
			wantValue(t, uf, "Service", "User", "vllm")
			wantValue(t, uf, "Service", "CapabilityBoundingSet", "")
			wantValue(t, uf, "Service", "ProtectSystem", "strict")
			wantValue(t, uf, "Service", "SystemCallFilter", "@system-service")
			// Its own network namespace: reachable only through its proxy socket.
			wantValue(t, uf, "Service", "PrivateNetwork", "yes")
			wantValue(t, uf, "Service", "IPAddressDeny", "any")
			wantValue(t, uf, "Service", "IPAddressAllow", "localhost")
			for _, k := range []string{"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "ProcSubset", "MemoryDenyWriteExecute"} {
				if v, ok := uf.Value("Service", k); ok {
					t.Errorf("%s=%s is set; it breaks CUDA, NVIDIA device access or the server", k, v)
				}
			}
		})
	}
	for _, bad := range []string{"models", "/srv/a b", "/srv/../x", "/srv/x\nUser=root", `/srv/"x"`} {
		u := vllmUnit()
		u.ReadWritePaths = []string{bad}
		if err := u.Validate(); err == nil || !strings.Contains(err.Error(), "read-write path") {
			t.Errorf("ReadWritePaths %q: Validate() = %v, want a read-write path error", bad, err)
		}
	}
}

// TestRenderProxyUnits: one socket and one relay per distinct port, the
// socket readable and writable by gpuhost's user only, the relay inside
// the backend's network namespace and never starting the backend; an
// adopted unit gets none.
func TestRenderProxyUnits(t *testing.T) {
	u := vllmUnit()
	u.Ports = []int{8001, 8000, 8001}
	u.SocketUser = "gpuhost"
	files := RenderProxyUnits(u)
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	want := []string{"gpuhost-vllm-proxy-8000.socket", "gpuhost-vllm-proxy-8000.service", "gpuhost-vllm-proxy-8001.socket", "gpuhost-vllm-proxy-8001.service"}
	if !slices.Equal(names, want) {
		t.Fatalf("files %q, want %q", names, want)
	}
	if got := u.ProxySocketUnits(); !slices.Equal(got, []string{want[0], want[2]}) {
		t.Errorf("ProxySocketUnits() = %q", got)
	}
	sock := mustParse(t, files[0].Content)
	wantValue(t, sock, "Socket", "ListenStream", "/run/gpuhost/gpuhost-vllm-8000.sock")
	wantValue(t, sock, "Socket", "SocketUser", "gpuhost")
	wantValue(t, sock, "Socket", "SocketMode", "0600")
	if ProxySocketPath(u.Name, 8000) != "/run/gpuhost/gpuhost-vllm-8000.sock" {
		t.Errorf("ProxySocketPath = %q", ProxySocketPath(u.Name, 8000))
	}
	svc := mustParse(t, files[1].Content)
	wantValue(t, svc, "Unit", "JoinsNamespaceOf", "gpuhost-vllm.service")
	wantValue(t, svc, "Service", "PrivateNetwork", "yes")
	wantValue(t, svc, "Service", "ExecStart", SocketProxyd+" 127.0.0.1:8000")
	for _, k := range []string{"Requires", "Wants", "BindsTo"} {
		for _, v := range svc.List("Unit", k) {
			if v == u.Name {
				t.Errorf("relay %s=%s: a connection must not start the backend", k, v)
			}
		}
	}
	d := mustParse(t, RenderDaemonUnit(DaemonUnit{Binary: "/b", Config: "/c", Sockets: u.ProxySocketUnits()}))
	if got := d.List("Unit", "Wants"); !slices.Contains(got, want[0]) || !slices.Contains(got, want[2]) {
		t.Errorf("gpuhost.service Wants=%q, want both sockets", got)
	}

	u.Adopt = true
	if f := RenderProxyUnits(u); f != nil || u.ProxySocketUnits() != nil {
		t.Errorf("adopted unit: proxy files %v, want none", f)
	}
	bad := vllmUnit()
	bad.Ports, bad.SocketUser = []int{0}, "no body"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "port 0") || !strings.Contains(err.Error(), "socket user") {
		t.Errorf("Validate() = %v, want the port and the socket user named", err)
	}
}
