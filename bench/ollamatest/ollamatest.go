// Package ollamatest runs a real Ollama for integration tests: it builds
// `ollama` from the Go module proxy (no other download), caches the binary,
// generates a tiny model with bench/tinygguf and serves it on a spare
// loopback port with all state in the test's temp directory.
//
// Building needs cgo with a C++ compiler and two Debian packages,
// nlohmann-json3-dev and libstb-dev (the module zip leaves out llama.cpp's
// vendored headers); miniaudio, which Debian lacks, comes from the stand-in
// header in include/. Where the build cannot work for lack of a compiler, a
// package or the module proxy, tests are skipped loudly, unless
// GPUHOST_REQUIRE_OLLAMA=1 (as CI sets) makes that a failure.
//
// GPUHOST_OLLAMA_BIN names a prebuilt binary to use instead.
package ollamatest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gpuhost/bench/tinygguf"
	"gpuhost/internal/testkit"
)

// Versions are the Ollama releases gpuhost is verified with, the default
// first. Past the last one Ollama runs GGUF models on llama.cpp's own
// llama-server, which its build fetches from a git host outside the Go
// module proxy, so no later release can run a model when built here.
var Versions = []string{"0.17.4", "0.24.0"}

// VersionEnv names the release of Versions the tests build and run
// (the default when unset).
const VersionEnv = "GPUHOST_OLLAMA_VERSION"

// Version is the Ollama release built and run: $GPUHOST_OLLAMA_VERSION when
// it is one of Versions, else the default. An unknown value is refused by
// Ensure rather than silently replaced.
var Version, versionErr = pickVersion(os.Getenv(VersionEnv))

func pickVersion(v string) (string, error) {
	if v == "" {
		return Versions[0], nil
	}
	if slices.Contains(Versions, v) {
		return v, nil
	}
	return Versions[0], fmt.Errorf("%s=%s is not a verified Ollama release (one of %s)", VersionEnv, v, strings.Join(Versions, ", "))
}

// ModelName is the model Start creates.
const ModelName = "tiny"

// Module is Ollama's Go module path.
const Module = "github.com/ollama/ollama"

// buildTimeout bounds the cold build (3.5–4 minutes on 2 cores).
const buildTimeout = 30 * time.Minute

// RequireEnv, set to 1, turns a build that cannot run into a test failure.
const RequireEnv = "GPUHOST_REQUIRE_OLLAMA"

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binSkip bool // binErr is a missing prerequisite, not a broken build
	// BuildDuration is how long this process spent building (0 when the
	// cached binary was used), for reporting.
	BuildDuration time.Duration
)

// Binary returns the path of an ollama binary of Version: GPUHOST_OLLAMA_BIN,
// or the cached build under the user cache dir, or a fresh build. It skips
// the test (or fails it with GPUHOST_REQUIRE_OLLAMA=1) when the build's
// prerequisites are missing.
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() { binPath, binSkip, binErr = Ensure() })
	if binErr != nil {
		if binSkip && os.Getenv(RequireEnv) != "1" {
			t.Skipf("SKIPPING real-Ollama test: %v (set %s=1 to make this a failure)", binErr, RequireEnv)
		}
		t.Fatalf("real Ollama unavailable: %v", binErr)
	}
	return binPath
}

// CachePath is where the built binary is kept: <user cache dir>/gpuhost/ollama-<version>/ollama.
func CachePath() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find the user cache dir for the ollama build: %w", err)
	}
	return filepath.Join(base, "gpuhost", "ollama-"+Version, "ollama"), nil
}

// Ensure returns the ollama binary, building and caching it when needed;
// concurrent callers (test binaries of several packages) build once. skip
// is true when a failure is a missing prerequisite. CI runs it up front
// (go run ./bench/ollamatest/buildollama) so that no test's timeout has to
// cover a cold build.
func Ensure() (path string, skip bool, err error) { return EnsureProgress(nil) }

// EnsureProgress is Ensure that reports on progress, when not nil: what it
// waits for, what it downloads, and while compiling (minutes) a line every
// ProgressEvery with the time spent and the packages built so far.
func EnsureProgress(progress io.Writer) (path string, skip bool, err error) {
	if versionErr != nil {
		return "", false, versionErr
	}
	if p := os.Getenv("GPUHOST_OLLAMA_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", false, fmt.Errorf("GPUHOST_OLLAMA_BIN=%s: %w", p, err)
		}
		return p, false, nil
	}
	path, err = CachePath()
	if err != nil {
		return "", true, err
	}
	if usable(path) {
		return path, false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", true, fmt.Errorf("create the ollama cache dir: %w", err)
	}
	// Another test process may be building too: one builds, the others wait.
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(path), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", true, fmt.Errorf("open the ollama build lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return "", true, fmt.Errorf("lock the ollama build: %w", err)
		}
		report(progress, "another process is building ollama %s (lock %s); waiting for it", Version, lock.Name())
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			return "", true, fmt.Errorf("lock the ollama build: %w", err)
		}
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // released on close anyway
	if usable(path) {
		return path, false, nil
	}
	t0 := time.Now()
	skip, err = build(context.Background(), path, progress)
	BuildDuration = time.Since(t0)
	return path, skip, err
}

// ProgressEvery is how often a build with a progress writer says it is
// still compiling.
var ProgressEvery = 30 * time.Second

func report(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "buildollama: "+format+"\n", args...)
	}
}

// usable reports whether path is an executable file.
func usable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// IncludeDir is the folder with the stand-in miniaudio header.
func IncludeDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "include")
}

// missingPrereq matches build output that means a prerequisite is missing
// rather than the build being broken.
var missingPrereq = regexp.MustCompile(`(?m)fatal error: [^\n]*: No such file or directory|C compiler "[^"]*" not found|exec: "[^"]*": executable file not found|cgo: C compiler|dial tcp|no such host|module lookup disabled|proxyconnect|connection refused|i/o timeout`)

// Build compiles Ollama Version from the Go module proxy into out (written
// atomically). skip is true when the failure is a missing prerequisite (no
// compiler, header packages or module proxy).
func Build(ctx context.Context, out string) (skip bool, err error) { return build(ctx, out, nil) }

func build(ctx context.Context, out string, progress io.Writer) (skip bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	for _, v := range [][2]string{{"CC", "gcc"}, {"CXX", "g++"}} {
		name := os.Getenv(v[0])
		if name == "" {
			name = v[1]
		}
		if _, err := exec.LookPath(strings.Fields(name + " x")[0]); err != nil {
			return true, fmt.Errorf("building ollama needs a C/C++ compiler: %s (%s) not found", name, v[0])
		}
	}
	for _, h := range []string{"/usr/include/nlohmann/json_fwd.hpp", "/usr/include/stb/stb_image.h"} {
		if _, err := os.Stat(h); err != nil {
			return true, fmt.Errorf("building ollama needs %s (apt-get install nlohmann-json3-dev libstb-dev)", h)
		}
	}
	work, err := os.MkdirTemp("", "gpuhost-ollama-build-")
	if err != nil {
		return true, fmt.Errorf("temp dir for the ollama build: %w", err)
	}
	defer os.RemoveAll(work)
	env := buildEnv(work)

	report(progress, "downloading %s@v%s from the module proxy", Module, Version)
	dl := exec.CommandContext(ctx, "go", "mod", "download", "-json", Module+"@v"+Version)
	dl.Dir, dl.Env = work, env
	dlOut, err := dl.Output()
	if err != nil {
		var ee *exec.ExitError
		msg := string(dlOut)
		if errors.As(err, &ee) {
			msg += string(ee.Stderr)
		}
		return true, fmt.Errorf("download %s@v%s from the module proxy: %v\n%s", Module, Version, err, msg)
	}
	var mod struct {
		Dir   string
		Error string
	}
	if err := json.Unmarshal(dlOut, &mod); err != nil || mod.Dir == "" {
		return true, fmt.Errorf("download %s@v%s: %v %s", Module, Version, err, mod.Error)
	}

	tmp := out + ".tmp-" + strconv.Itoa(os.Getpid())
	// -v names each package as it is built: the progress lines count them.
	goBuild := exec.CommandContext(ctx, "go", "build", "-v", "-trimpath",
		"-ldflags", "-s -w -X "+Module+"/version.Version="+Version, "-o", tmp, ".")
	goBuild.Dir, goBuild.Env = mod.Dir, env
	buf := &buildLog{}
	goBuild.Stdout, goBuild.Stderr = buf, buf
	report(progress, "compiling ollama %s with cgo (llama.cpp; about 4 minutes on 2 idle cores, much longer on a loaded machine)", Version)
	t0 := time.Now()
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		if progress == nil {
			return
		}
		tick := time.NewTicker(ProgressEvery)
		defer tick.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-tick.C:
				pkgs, downloads, last := buf.progress()
				report(progress, "still compiling ollama %s: %s, %d packages built, %d modules downloaded (last: %s)",
					Version, time.Since(t0).Round(time.Second), pkgs, downloads, orNone(last))
			}
		}
	}()
	err = goBuild.Run()
	close(stopProgress)
	<-progressDone
	if pkgs, _, _ := buf.progress(); err == nil {
		report(progress, "compiled ollama %s in %s (%d packages built)", Version, time.Since(t0).Round(time.Second), pkgs)
	}
	if err != nil {
		os.Remove(tmp)
		text := buf.String()
		if len(text) > 6000 {
			text = "…" + text[len(text)-6000:]
		}
		return missingPrereq.MatchString(text), fmt.Errorf("go build %s@v%s: %v\n%s", Module, Version, err, text)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("install the ollama build at %s: %w", out, err)
	}
	return false, nil
}

// buildLog keeps go build -v's output for the error message and counts,
// for the progress lines, the packages built (lines that are an import path)
// and the modules downloaded ("go: downloading ..."). It is written by the
// build and read by the progress ticker.
type buildLog struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	partial   []byte
	pkgs      int
	downloads int
	last      string
}

func (b *buildLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	b.partial = append(b.partial, p...)
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(b.partial[:i]))
		b.partial = b.partial[i+1:]
		switch {
		case strings.HasPrefix(line, "go: downloading "):
			b.downloads++
		case line != "" && !strings.ContainsAny(line, " \t:") && !strings.HasPrefix(line, "#"):
			b.pkgs++
			b.last = line
		}
	}
	return len(p), nil
}

func (b *buildLog) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *buildLog) progress() (pkgs, downloads int, last string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pkgs, b.downloads, b.last
}

func orNone(s string) string {
	if s == "" {
		return "none yet"
	}
	return s
}

// buildEnv is the environment of the build: cgo on, the stand-in header on
// the C++ include path, no workspace, and module mode that may fetch.
func buildEnv(work string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "CGO_ENABLED", "CPLUS_INCLUDE_PATH", "GOWORK", "GOFLAGS", "GO111MODULE":
			continue
		}
		env = append(env, kv)
	}
	inc := IncludeDir()
	if old := os.Getenv("CPLUS_INCLUDE_PATH"); old != "" {
		inc += string(os.PathListSeparator) + old
	}
	return append(env, "CGO_ENABLED=1", "CPLUS_INCLUDE_PATH="+inc, "GOWORK=off", "GOFLAGS=-mod=mod", "GO111MODULE=on",
		"GOTMPDIR="+work)
}

// ModelConfig sizes the served model: wider than tinygguf's default (3.5M
// parameters, 14 MB, ~200 tok/s on one thread) so that a decode step
// dwarfs the per-token work outside Ollama's eval_duration (sampling,
// streaming, being scheduled on a busy machine). With the default ~119K
// parameters that work is 5–10 % of the client's time; here it is 1–3 %,
// which is what lets a test hold client and server rates within 5 %.
var ModelConfig = tinygguf.Config{Dim: 384, FFDim: 1536, Blocks: 2, Heads: 6, KVHeads: 2}

// Modelfile writes the tiny model and its Modelfile into dir and returns
// the Modelfile's path: a plain template (the prompt as is) and one thread,
// which on a small machine is far faster and steadier than several.
func Modelfile(t testing.TB, dir string) string {
	t.Helper()
	gguf, err := tinygguf.WriteFile(dir, ModelConfig)
	if err != nil {
		t.Fatal(err)
	}
	mf := filepath.Join(dir, "Modelfile")
	text := fmt.Sprintf("FROM %s\nTEMPLATE \"\"\"{{ .Prompt }}\"\"\"\nPARAMETER num_thread 1\nPARAMETER num_ctx 4096\nPARAMETER temperature 0\n", gguf)
	if err := os.WriteFile(mf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return mf
}

// Create runs `ollama create name -f modelfile` against the server at
// baseURL (http://host:port).
func Create(t testing.TB, bin, baseURL, name, modelfile string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "create", name, "-f", modelfile)
	cmd.Env = append(os.Environ(), "OLLAMA_HOST="+strings.TrimPrefix(baseURL, "http://"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ollama create %s: %v\n%s", name, err, out)
	}
}

// Start serves the tiny model with a real `ollama serve` on a spare
// loopback port, all state (OLLAMA_MODELS, HOME) in a temp dir, and stops
// it when the test ends. It returns the base URL (http://127.0.0.1:PORT)
// and the model name.
func Start(t testing.TB) (baseURL, model string) {
	t.Helper()
	return StartEnv(t)
}

// StartEnv is Start with extra environment for `ollama serve` (KEY=VALUE,
// e.g. OLLAMA_NUM_PARALLEL=4): the server settings a test compares.
func StartEnv(t testing.TB, env ...string) (baseURL, model string) {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	for _, d := range []string{"home", "models"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port := testkit.FreePort(t)
	host := "127.0.0.1:" + strconv.Itoa(port)
	baseURL = "http://" + host
	logPath := filepath.Join(dir, "serve.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "OLLAMA_HOST="+host, "OLLAMA_MODELS="+filepath.Join(dir, "models"),
		"HOME="+filepath.Join(dir, "home"), "OLLAMA_KEEP_ALIVE=1h", "OLLAMA_NOPRUNE=1")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its runner joins the group
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start ollama serve: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		stop(cmd.Process.Pid, exited)
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("ollama serve log (%s):\n%s", logPath, tail(b, 4000))
			}
		}
	})
	if err := waitReady(baseURL, exited, 60*time.Second); err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("ollama serve on %s: %v\n%s", host, err, tail(b, 4000))
	}
	Create(t, bin, baseURL, ModelName, Modelfile(t, dir))
	return baseURL, ModelName
}

// stop ends serve with SIGTERM (it stops its runner itself), then kills
// the process group it leads if it lingers.
func stop(pid int, exited <-chan error) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-exited
	}
}

func waitReady(baseURL string, exited <-chan error, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	client := &http.Client{Timeout: 2 * time.Second}
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("exited before it answered: %v", err)
		default:
		}
		resp, err := client.Get(baseURL + "/")
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), "Ollama is running") {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no answer within %s", limit)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		return "…" + string(b[len(b)-n:])
	}
	return string(b)
}
