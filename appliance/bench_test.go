package appliance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/loopback"
	"gpuhost/systemd"
)

// BenchmarkSwitchOverhead measures what gpuhost adds to a switch: the wall
// time of `POST /api/switch` (wait) minus the bare time of the same work done
// directly over D-Bus in the same private systemd (stop the old unit, start
// the new one, poll its health every millisecond until it answers, and for
// Ollama load the model), measured alternately in one run. Run with
// `make bench`; needs root (private systemd).
func BenchmarkSwitchOverhead(b *testing.B) {
	for _, load := range []string{"0s", "1500ms"} {
		b.Run("vllm_load="+load, func(b *testing.B) {
			e := startE2E(b, load)
			e.switchTo(b, "coder") // writes both env files via a round trip
			e.switchTo(b, "llama")
			e.switchTo(b, "coder")
			bare := startBare(b, e)
			defer bare.close()
			var gpuhostD, bareD [2][]time.Duration // index 0: → llama, 1: → coder
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for dir, p := range []string{"llama", "coder"} {
					gpuhostD[dir] = append(gpuhostD[dir], e.timedSwitch(b, p))
					// Back to the start without measuring, then the bare run.
					back := map[string]string{"llama": "coder", "coder": "llama"}[p]
					e.timedSwitch(b, back)
					bareD[dir] = append(bareD[dir], bare.switchTo(b, p))
					e.waitState(b, "reconciled after the bare switch", 10*time.Second, func(s api.Status) bool {
						return s.State.Phase == api.PhaseActive && s.State.Profile == p
					})
				}
			}
			b.StopTimer()
			// Medians of the paired differences: robust against the odd
			// slow run on a shared machine.
			for dir, name := range []string{"ollama", "vllm"} {
				diffs := make([]time.Duration, len(gpuhostD[dir]))
				for i := range diffs {
					diffs[i] = gpuhostD[dir][i] - bareD[dir][i]
				}
				b.ReportMetric(medianMS(gpuhostD[dir]), "gpuhost_to_"+name+"_ms")
				b.ReportMetric(medianMS(bareD[dir]), "bare_to_"+name+"_ms")
				b.ReportMetric(medianMS(diffs), "overhead_to_"+name+"_ms")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func (e *e2e) timedSwitch(b testing.TB, profile string) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	acc, err := e.client.Switch(ctx, api.SwitchRequest{Profile: profile, Wait: true})
	d := time.Since(t0)
	if err != nil || acc.State == nil || acc.State.Profile != profile {
		b.Fatalf("switch to %s: %v %+v", profile, err, acc.State)
	}
	return d
}

// bareSwitcher is a child process inside the private systemd's PID
// namespace that performs bare switches on request (stdin: profile name,
// stdout: elapsed microseconds), so no process start is measured.
type bareSwitcher struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	cfg *config.Config
}

func startBare(b testing.TB, e *e2e) *bareSwitcher {
	exe, _ := os.Executable()
	cmd := e.sd.Command(context.Background(), exe, "-test.run=^TestBareSwitchChild$", "-test.v")
	spec := fmt.Sprintf("%s %d %s %d %s", e.cfg.Backends.VLLM.Unit, e.cfg.Profiles["coder"].Port,
		e.cfg.Backends.Ollama.Unit, e.cfg.Profiles["llama"].Port, e.cfg.Profiles["llama"].Model)
	// The backends are fenced in their own network: the bare switcher
	// reaches them through their sockets, as gpuhost does.
	var socks []string
	for port, path := range e.cfg.BackendSockets() {
		socks = append(socks, fmt.Sprintf("%d=%s", port, path))
	}
	cmd.Env = append(os.Environ(), "GPUHOST_BARE="+spec, "GPUHOST_BARE_SOCKETS="+strings.Join(socks, ","))
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &bareSwitcher{cmd: cmd, in: in, out: bufio.NewScanner(out), cfg: e.cfg}
	for s.out.Scan() {
		if s.out.Text() == "BARE READY" {
			return s
		}
	}
	b.Fatal("bare switcher did not start")
	return nil
}

func (s *bareSwitcher) switchTo(b testing.TB, profile string) time.Duration {
	fmt.Fprintln(s.in, profile)
	for s.out.Scan() {
		if v, ok := strings.CutPrefix(s.out.Text(), "BARE "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatalf("bare switch to %s: %s", profile, v)
			}
			return time.Duration(us) * time.Microsecond
		}
	}
	b.Fatalf("bare switcher ended: %v", s.out.Err())
	return 0
}

func (s *bareSwitcher) close() {
	s.in.Close()
	_ = s.cmd.Wait()
}

// TestBareSwitchChild is the bare switcher's body (see startBare).
func TestBareSwitchChild(t *testing.T) {
	spec := strings.Fields(os.Getenv("GPUHOST_BARE"))
	if len(spec) != 5 {
		t.Skip("helper process for BenchmarkSwitchOverhead")
	}
	vllmUnit, vllmPort, ollamaUnit, ollamaPort, model := spec[0], spec[1], spec[2], spec[3], spec[4]
	ctx := context.Background()
	m, err := systemd.ConnectPrivate(ctx, "/run/systemd/private")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d := &loopback.Dialer{Sockets: map[int]string{}}
	for _, kv := range strings.Split(os.Getenv("GPUHOST_BARE_SOCKETS"), ",") {
		if port, path, ok := strings.Cut(kv, "="); ok {
			n, _ := strconv.Atoi(port)
			d.Sockets[n] = path
		}
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil, DialContext: d.DialContext}}
	poll := func(url string) {
		for {
			if resp, err := client.Get(url); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}
	fmt.Println("BARE READY")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		t0 := time.Now()
		switch in.Text() {
		case "llama":
			if err := m.Stop(ctx, vllmUnit); err != nil {
				t.Fatal(err)
			}
			if err := m.Start(ctx, ollamaUnit); err != nil {
				t.Fatal(err)
			}
			poll("http://127.0.0.1:" + ollamaPort + "/api/version")
			resp, err := client.Post("http://127.0.0.1:"+ollamaPort+"/api/generate", "application/json",
				bytes.NewReader([]byte(`{"model":"`+model+`","keep_alive":-1,"stream":false}`)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		case "coder":
			if err := m.Stop(ctx, ollamaUnit); err != nil {
				t.Fatal(err)
			}
			if err := m.Start(ctx, vllmUnit); err != nil {
				t.Fatal(err)
			}
			poll("http://127.0.0.1:" + vllmPort + "/health")
		}
		fmt.Printf("BARE %d\n", time.Since(t0).Microseconds())
	}
}

func medianMS(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return float64(m.Microseconds()) / 1000
}
