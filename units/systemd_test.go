package units

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/internal/testkit"
	"gpuhost/systemd/systemdtest"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestUnitsUnderRealSystemd proves the core claim of this package on the
// machine's real systemd: the argv gpuhost renders reaches the backend
// process exactly, through EnvFile, `$GPUHOST_ARGS` splitting and
// QuoteExecWord, and Conflicts= (rendered or added by the adopt drop-in)
// stops the other backend.
func TestUnitsUnderRealSystemd(t *testing.T) {
	dir := t.TempDir()
	sd := systemdtest.Start(t, systemdtest.Options{Keep: []string{dir}})
	unitDir := sd.UnitDir
	systemctl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := sd.Systemctl(ctx, args...)
		if err != nil && args[0] != "is-active" {
			t.Fatalf("systemctl %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(out)
	}

	// The "backend" records its argv and environment, then stays up; the
	// sandbox lets it write only dir (its ReadWritePaths=).
	dump := filepath.Join(dir, "dump-argv")
	writeFile(t, dump, "#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" > \""+dir+"/argv-$GPUHOST_PROFILE\"\nenv > \""+dir+"/env-$GPUHOST_PROFILE\"\nexec sleep 300\n")
	if err := os.Chmod(dump, 0o755); err != nil {
		t.Fatal(err)
	}

	v := qwenCoder()
	v.VLLM.ExtraArgs = []string{"--host=127.0.0.1"}
	v.Sim = SimOpts{LoadTime: "1.5s", PrefillTPS: 2545.5}
	if errs := v.Validate(); errs != nil {
		t.Fatalf("profile: %v", errs)
	}
	// Validate refuses '$', '%', '`' and ';' in extra_args; were one to get
	// through, systemd would still pass it on literally: it expands neither
	// $VAR nor specifiers inside $GPUHOST_ARGS's value.
	v.VLLM.ExtraArgs = append(v.VLLM.ExtraArgs, "--odd=$HOME%n`x;y${PATH}")
	o := llamaOllama()
	vu := BackendUnit{Backend: VLLM, Name: "gpuhost-vllm.service", EnvFile: filepath.Join(dir, "vllm.env"),
		Exec:      []string{dump, "100%", "$HOME", `say "hi" \ there`, ";", "tab and ünï"},
		Conflicts: []string{"gpuhost-ollama.service"}, ReadWritePaths: []string{dir}}
	ou := BackendUnit{Backend: Ollama, Name: "gpuhost-ollama.service", EnvFile: filepath.Join(dir, "ollama.env"),
		Exec: []string{dump}, Conflicts: []string{"gpuhost-vllm.service"}, ReadWritePaths: []string{dir}}
	adopted := BackendUnit{Backend: VLLM, Name: "vllm-op.service", Adopt: true, Conflicts: []string{"gpuhost-ollama.service"}}
	for _, u := range []BackendUnit{vu, ou, adopted} {
		if err := u.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, vu.EnvFile, EnvFile(v, true))
	writeFile(t, ou.EnvFile, EnvFile(o, false))
	writeFile(t, filepath.Join(unitDir, vu.Name), RenderBackendUnit(vu))
	writeFile(t, filepath.Join(unitDir, ou.Name), RenderBackendUnit(ou))
	writeFile(t, filepath.Join(unitDir, adopted.Name), "[Service]\nExecStart=/bin/sleep 300\n")
	dropPath, dropIn := RenderAdoptDropIn(adopted)
	writeFile(t, filepath.Join(unitDir, dropPath), dropIn)
	systemctl("daemon-reload")

	wantArgv := func(u BackendUnit, p Profile, simulated bool) string {
		return strings.Join(append(append([]string{}, u.Exec...), BackendArgs(p, simulated)...), "\x00") + "\x00"
	}
	readWhenThere := func(name string) string {
		var b []byte
		testkit.Eventually(t, 15*time.Second, func() bool {
			var err error
			b, err = os.ReadFile(filepath.Join(dir, name))
			return err == nil && len(b) > 0
		}, name)
		return string(b)
	}

	systemctl("start", vu.Name)
	if got, want := readWhenThere("argv-coder"), wantArgv(vu, v, true); got != want {
		t.Errorf("vLLM unit argv:\n got %q\nwant %q", strings.Split(got, "\x00"), strings.Split(want, "\x00"))
	}

	systemctl("start", ou.Name)
	if got, want := readWhenThere("argv-llama"), wantArgv(ou, o, false); got != want {
		t.Errorf("Ollama unit argv:\n got %q\nwant %q", strings.Split(got, "\x00"), strings.Split(want, "\x00"))
	}
	if st := systemctl("is-active", vu.Name); st != "inactive" {
		t.Errorf("after starting %s, %s is %q; Conflicts= should have stopped it", ou.Name, vu.Name, st)
	}
	env := readWhenThere("env-llama")
	for _, kv := range []string{"OLLAMA_HOST=127.0.0.1:11434", "OLLAMA_KEEP_ALIVE=-1", "OLLAMA_CONTEXT_LENGTH=8192", "GPUHOST_PROFILE=llama"} {
		if !strings.Contains(env, kv+"\n") {
			t.Errorf("Ollama environment lacks %s:\n%s", kv, env)
		}
	}

	// The adopt drop-in alone makes the operator's unit exclusive, both ways.
	systemctl("start", adopted.Name)
	if st := systemctl("is-active", ou.Name); st != "inactive" {
		t.Errorf("after starting adopted %s, %s is %q", adopted.Name, ou.Name, st)
	}
	systemctl("start", ou.Name)
	if st := systemctl("is-active", adopted.Name); st != "inactive" {
		t.Errorf("after starting %s, adopted %s is %q", ou.Name, adopted.Name, st)
	}
}

// helperBackendEnv makes this test binary a stand-in backend (see
// TestMain): an HTTP server on 127.0.0.1:$GPUHOST_UNITS_HELPER_PORT with a
// vLLM-like /sleep, /wake_up and /is_sleeping.
const helperBackendEnv = "GPUHOST_UNITS_HELPER_PORT"

func TestMain(m *testing.M) {
	if port := os.Getenv(helperBackendEnv); port != "" {
		serveHelperBackend(port)
		return
	}
	os.Exit(m.Run())
}

func serveHelperBackend(port string) {
	var mu sync.Mutex
	asleep := false
	mux := http.NewServeMux()
	set := func(v bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			asleep = v
			mu.Unlock()
		}
	}
	mux.HandleFunc("POST /sleep", set(true))
	mux.HandleFunc("POST /wake_up", set(false))
	mux.HandleFunc("GET /is_sleeping", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, `{"is_sleeping":%t}`, asleep)
	})
	srv := &http.Server{Addr: "127.0.0.1:" + port, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// TestBackendReachableOnlyThroughSocket: under a real systemd, the rendered
// backend unit listens on 127.0.0.1:PORT of its own network namespace. A
// curl to that port from the host namespace is refused; the socket unit's
// relay reaches it; a user other than the socket's owner cannot open the
// socket. Before this change the same curl changed the backend's state.
func TestBackendReachableOnlyThroughSocket(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	port := testkit.FreePort(t)
	u := BackendUnit{Backend: VLLM, Name: "gpuhost-vllm.service", EnvFile: filepath.Join(dir, "vllm.env"),
		Exec: []string{self}, ReadWritePaths: []string{dir}, Ports: []int{port}}
	if err := u.Validate(); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{u.Name: RenderBackendUnit(u)}
	for _, f := range RenderProxyUnits(u) {
		files[f.Name] = f.Content
	}
	writeFile(t, u.EnvFile, fmt.Sprintf("%s=%d\n", helperBackendEnv, port))
	sd := systemdtest.Start(t, systemdtest.Options{Units: files, Keep: []string{dir}, NetAdmin: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, args := range [][]string{{"start", ProxySocketUnit(u.Name, port)}, {"start", u.Name}} {
		if out, err := sd.Systemctl(ctx, args...); err != nil {
			t.Fatalf("systemctl %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	sock := ProxySocketPath(u.Name, port)
	curl := func(args ...string) (string, error) {
		out, err := sd.Command(ctx, "curl", append([]string{"-sS", "--max-time", "10"}, args...)...).CombinedOutput()
		return string(out), err
	}
	viaSocket := func(method, path string) string {
		t.Helper()
		var out string
		var err error
		if testkit.Poll(20*time.Second, func() bool {
			out, err = curl("-X", method, "--unix-socket", sock, "http://localhost"+path)
			return err == nil
		}) {
			return out
		}
		st, _ := sd.Systemctl(ctx, "status", "--no-pager", "-n", "20", u.Name, proxyBase(u.Name, port)+".service", ProxySocketUnit(u.Name, port))
		t.Fatalf("%s %s through %s: %v %s\n%s", method, path, sock, err, out, st)
		return ""
	}
	if got := viaSocket("GET", "/is_sleeping"); got != `{"is_sleeping":false}` {
		t.Fatalf("through the socket: %q", got)
	}

	// The backend's old address, from the host's network namespace (which
	// the private systemd shares): nothing listens there.
	if out, err := curl("-X", "POST", fmt.Sprintf("http://127.0.0.1:%d/sleep", port)); err == nil {
		t.Errorf("curl -X POST 127.0.0.1:%d/sleep from the host namespace succeeded (%q); the backend must be unreachable", port, out)
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second); err == nil {
		c.Close()
		t.Errorf("TCP connect to 127.0.0.1:%d from the test process succeeded", port)
	}
	// Another local user cannot open the socket (0600, owned by gpuhost's user).
	if out, err := sd.Command(ctx, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		"curl", "-sS", "--max-time", "10", "-X", "POST", "--unix-socket", sock, "http://localhost/sleep").CombinedOutput(); err == nil {
		t.Errorf("user 65534 reached the backend through %s: %q", sock, out)
	} else if !strings.Contains(string(out), "Couldn't connect") {
		t.Errorf("user 65534: want curl's \"Couldn't connect\" (EACCES), got %v %q", err, out)
	}
	if out, err := sd.Command(ctx, "stat", "-c", "%F %a %U", sock).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "socket 600 root" {
		t.Errorf("stat %s: %v %q, want a socket of mode 600 owned by root (gpuhost's user here)", sock, err, out)
	}
	if got := viaSocket("GET", "/is_sleeping"); got != `{"is_sleeping":false}` {
		t.Errorf("after the refused attempts the backend says %q, want awake", got)
	}
	// gpuhost's own path changes state, and the relay survives a restart
	// of the backend (the new process joins the relay's namespace).
	viaSocket("POST", "/sleep")
	if got := viaSocket("GET", "/is_sleeping"); got != `{"is_sleeping":true}` {
		t.Errorf("after POST /sleep through the socket: %q", got)
	}
	if out, err := sd.Systemctl(ctx, "restart", u.Name); err != nil {
		t.Fatalf("restart: %v %s", err, out)
	}
	if got := viaSocket("GET", "/is_sleeping"); got != `{"is_sleeping":false}` {
		t.Errorf("after a restart through the socket: %q", got)
	}
}
