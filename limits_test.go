package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
)

// limitDaemon is `gpuhost serve` in a process of its own, so its file
// descriptors and memory can be read from /proc without the test's own.
type limitDaemon struct {
	cmd  *exec.Cmd
	addr string
	url  string
}

func startLimitDaemon(t *testing.T, extraYAML string, vllmLoad string) *limitDaemon {
	t.Helper()
	return startServeProcess(t, binPath, "127.0.0.1", "", extraYAML, vllmLoad)
}

// startServeProcess starts bin's `gpuhost serve` on host at a free port,
// idle (no default profile: the test switches itself), with extraYAML
// appended to the test config and the simulated vLLM loading for vllmLoad;
// token, when set, is its API token. It returns once the daemon answers.
func startServeProcess(t *testing.T, bin, host, token, extraYAML, vllmLoad string) *limitDaemon {
	t.Helper()
	return startServeEdited(t, bin, host, token, func(y string) string { return y + "\n" + extraYAML }, vllmLoad)
}

// startServeEdited is startServeProcess with the test config rewritten by
// edit.
func startServeEdited(t *testing.T, bin, host, token string, edit func(string) string, vllmLoad string) *limitDaemon {
	t.Helper()
	state := t.TempDir()
	port := testkit.FreePort(t)
	y := testbin.ConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), vllmLoad)
	y = edit(strings.Replace(y, "listen: 127.0.0.1:0", fmt.Sprintf("listen: %s:%d", host, port), 1))
	y = strings.Replace(y, "default_profile: coder\n", "", 1)
	path := filepath.Join(state, "gpuhost.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", path)
	if token != "" {
		cmd.Env = append(os.Environ(), "GPUHOST_API_TOKEN="+token)
	}
	var logs testkit.SyncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("daemon log (tail):\n%s", tail(logs.String(), 4000))
		}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	d := &limitDaemon{cmd: cmd, addr: addr, url: "http://" + addr}
	c := api.NewClient(d.url, token)
	// The readiness probe keeps no idle connection: the connection caps
	// some tests set count every one.
	c.HTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.Status(context.Background()); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("daemon did not answer: %v", err)
		}
	}
	return d
}

// client keeps no idle connection: the connection cap counts every one.
func (d *limitDaemon) client() *api.Client {
	c := api.NewClient(d.url, "")
	c.HTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	return c
}

func (d *limitDaemon) fds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func (d *limitDaemon) rssMiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestIdleConnectionsBounded: 300 clients that each send one request and
// then idle on keep-alive hold at most http.max_connections of the
// daemon's file descriptors (before: one fd each, none ever closed).
func TestIdleConnectionsBounded(t *testing.T) {
	const maxConns, clients = 32, 300
	// One client (loopback) may use every connection here: this bound is
	// the total one.
	d := startLimitDaemon(t, fmt.Sprintf("http: {max_connections: %d, max_connections_per_client: %d, idle_timeout: 10m}", maxConns, maxConns), "10ms")
	base := d.fds(t)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < clients; i++ {
		c, err := net.Dial("tcp", d.addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "GET /api/profiles HTTP/1.1\r\nHost: %s\r\n\r\n", d.addr)
	}
	// The first maxConns are answered and then idle on keep-alive.
	answered := 0
	for _, c := range conns[:maxConns] {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("an accepted connection got no answer: %v", err)
		}
		resp.Body.Close()
		answered++
	}
	got := d.fds(t)
	t.Logf("daemon fds: %d before, %d with %d clients connected (%d answered, cap %d)", base, got, clients, answered, maxConns)
	if got > base+maxConns+8 {
		t.Fatalf("daemon holds %d fds with %d idle clients: more than http.max_connections (%d) beyond its %d at rest", got, clients, maxConns, base)
	}
	// Once clients leave, the waiting ones are served.
	for _, c := range conns[:maxConns] {
		c.Close()
	}
	c := conns[maxConns]
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a waiting client was never served after others left: %v", err)
	}
	resp.Body.Close()
}

// TestSlowBodyCut: a client that announces a body and stalls is cut off at
// http.body_read_timeout (before: held for as long as it liked).
func TestSlowBodyCut(t *testing.T) {
	d := startLimitDaemon(t, "http: {body_read_timeout: 1s}", "10ms")
	c, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /api/switch HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"profile\":", d.addr)
	// The budget is 30 times the timeout: only a daemon that never cuts the
	// client fails this, not a slow machine.
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the daemon still holds a client that stalled mid-body after 30 s (body_read_timeout 1s)")
	}
}

// TestBodyMemoryBounded: 4 × 100 MB to /mcp and 16 concurrent 32 MiB
// bodies to /v1 held during a switch leave the daemon's memory within its
// budgets (before: 1.0 GB and 863 MB).
func TestBodyMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("moves ~900 MB over loopback")
	}
	d := startLimitDaemon(t, "proxy: {body_memory_bytes: 67108864}", "60s")
	base := d.rssMiB(t)
	// /mcp: chunked 100 MB bodies are cut at http.max_body_bytes.
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr, pw := io.Pipe()
			go func() {
				chunk := make([]byte, 1<<20)
				for range 100 {
					if _, err := pw.Write(chunk); err != nil {
						return
					}
				}
				pw.Close()
			}()
			req, _ := http.NewRequest("POST", d.url+"/mcp", pr)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			pr.CloseWithError(io.ErrClosedPipe)
			if err == nil {
				codes[i] = resp.StatusCode
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if rss := d.rssMiB(t); rss > base+100 {
		t.Errorf("RSS %d MiB after 4 × 100 MB to /mcp (at rest %d MiB)", rss, base)
	}
	for i, c := range codes {
		if c != 0 && c != http.StatusRequestEntityTooLarge {
			t.Errorf("/mcp body %d: status %d, want 413", i, c)
		}
	}

	// /v1: a switch with a 60 s load holds requests; 16 × 32 MiB arrive.
	c := d.client()
	if _, err := c.Switch(context.Background(), api.SwitchRequest{Profile: "coder"}); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 32<<20)
	copy(body, `{"model":"qwen3-coder","pad":"`)
	for i := 31; i < len(body)-2; i++ {
		body[i] = 'x'
	}
	copy(body[len(body)-2:], `"}`)
	ctx, cancel := context.WithCancel(context.Background())
	type answer struct {
		status int
		retry  string
	}
	answers := make(chan answer, 16)
	for range 16 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/chat/completions", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{status: -1}
				return
			}
			resp.Body.Close()
			answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After")}
		}()
	}
	// 64 MiB fit two bodies: 14 answers come at once, two are held.
	refused := 0
	for range 14 {
		select {
		case a := <-answers:
			// A 503 sent while the client is still uploading can reach it
			// as a reset instead (status -1); the daemon's counter below is
			// the exact count of refusals.
			if a.status != -1 && (a.status != http.StatusServiceUnavailable || a.retry == "") {
				t.Errorf("answer %+v, want 503 with Retry-After", a)
			}
			refused++
		case <-time.After(120 * time.Second):
			t.Fatalf("only %d of 14 over-budget requests were refused", refused)
		}
	}
	rss := d.rssMiB(t)
	t.Logf("RSS at rest %d MiB, with 2 × 32 MiB held and 14 refused: %d MiB", base, rss)
	if rss > base+64+100 {
		t.Errorf("RSS %d MiB with a 64 MiB body budget (at rest %d MiB)", rss, base)
	}
	cancel()
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), `gpuhost_proxy_rejected_total{reason="body_memory"} 14`) {
		t.Errorf("/metrics does not count the 14 refusals:\n%s", grepLines(string(m), "gpuhost_proxy_rejected"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
