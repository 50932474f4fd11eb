package appliance

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/systemd"
)

func TestProvePortOwner(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	other := startSleeper(t).Process.Pid
	me := os.Getpid()
	cg := systemd.CgroupOf(me)
	tests := []struct {
		name      string
		port      int
		st        api.UnitStatus
		wantOwner bool   // a *PortOwnerError naming us
		wantErr   error  // errPortUnproven
		wantMsg   string // on success
	}{
		{"main process holds it", port, api.UnitStatus{Name: "u.service", MainPID: me}, false, nil, "by PID " + strconv.Itoa(me)},
		{"the unit's child holds it (no cgroup)", port, api.UnitStatus{Name: "u.service", MainPID: os.Getppid()}, false, nil, "by PID " + strconv.Itoa(me)},
		{"another process holds it", port, api.UnitStatus{Name: "u.service", MainPID: other + 1_000_000}, true, nil, ""},
		{"nothing listens", testkit.FreePort(t), api.UnitStatus{Name: "u.service", MainPID: other}, false, errPortUnproven, ""},
	}
	if cg != "" && cg != "/" {
		// other is our child, so it shares our cgroup; the listener is ours.
		tests = append(tests, struct {
			name      string
			port      int
			st        api.UnitStatus
			wantOwner bool
			wantErr   error
			wantMsg   string
		}{"a process in the unit's cgroup holds it", port, api.UnitStatus{Name: "u.service", MainPID: other, ControlGroup: cg}, false, nil, "by PID " + strconv.Itoa(me)})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := provePortOwner(tt.port, tt.st)
			var poe *PortOwnerError
			switch {
			case tt.wantOwner:
				if !errors.As(err, &poe) {
					t.Fatalf("err = %v, want a PortOwnerError", err)
				}
				for _, w := range []string{"port " + strconv.Itoa(port), "PID " + strconv.Itoa(me), "u.service"} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(msg, tt.wantMsg) {
					t.Errorf("message %q lacks %q", msg, tt.wantMsg)
				}
			}
		})
	}
}

// startForeignSimulator runs a second simulator (as a second demo would)
// on port, serving the same name, and returns its PID once it answers.
func startForeignSimulator(t *testing.T, port int, served string) int {
	t.Helper()
	cmd := exec.Command(gpuhostBinary(t), "simulate", "vllm", "Qwen/Qwen3-Coder-30B-A3B-Instruct",
		"--port", strconv.Itoa(port), "--served-model-name", served, "--load-time", "0s")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("foreign simulator does not listen on %d: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestForeignListenerFailsSwitch: another program answers on the profile's
// port with the right served name. Before, ready and verify accepted its
// answers and declared the switch done while the unit itself had failed to
// bind; now the switch fails naming the port, PID and program, and rolls
// back.
func TestForeignListenerFailsSwitch(t *testing.T) {
	f := newProcFixture(t, "300ms")
	if _, err := f.switchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	port := f.cfg.Profiles["coder"].Port
	pid := startForeignSimulator(t, port, f.cfg.Profiles["coder"].ServedName)

	evs, err := f.switchTo(t, "coder")
	if err == nil {
		t.Fatalf("switch to coder succeeded on another program's port:%s", describe(evs))
	}
	failed, ok := stepEvent(evs, "ready", "failed")
	if !ok {
		t.Fatalf("no failed ready step:%s", describe(evs))
	}
	for _, w := range []string{"port " + strconv.Itoa(port), "PID " + strconv.Itoa(pid), "(gpuhost)"} {
		if !strings.Contains(failed.Message, w) {
			t.Errorf("ready failure %q lacks %q", failed.Message, w)
		}
	}
	if !strings.Contains(err.Error(), "rolled back to llama") {
		t.Errorf("error %q does not report the rollback", err)
	}
	if st := f.sup.State(); st.Phase != api.PhaseActive || st.Profile != "llama" {
		t.Errorf("after the rollback state = %+v, want llama active", st)
	}
	vst, _ := f.sup.units.Unit(context.Background(), f.cfg.Backends.VLLM.Unit)
	if vst.Active() {
		t.Errorf("the failed vLLM unit is still %s", vst.ActiveState)
	}
}

// TestSystemdForeignListenerIsNotTheBackend is TestForeignListenerFailsSwitch
// under a private systemd, where the backend has its own network namespace:
// another unit's simulator, with the same served model, holds the profile's
// port on the host. That impersonator is never reached: the switch
// succeeds, the owner proof names the backend unit's own process in its
// namespace, not the impersonator. (Before the backends had a private
// network, the same setup failed the switch at the ready step, naming the
// foreign PID; the process runner still does: TestForeignListenerFailsSwitch.)
func TestSystemdForeignListenerIsNotTheBackend(t *testing.T) {
	bin := gpuhostBinary(t)
	port := testkit.FreePort(t)
	foreign := "[Unit]\nDescription=another program on the profile's port\n[Service]\nExecStart=" + bin +
		" simulate vllm Qwen/Qwen3-Coder-30B-A3B-Instruct --port " + strconv.Itoa(port) +
		" --served-model-name qwen3-coder --load-time 0s\n"
	e := startE2EWith(t, "300ms", t.TempDir(), func(y string) string {
		// The coder profile's port is the foreign program's.
		return strings.Replace(y, "port: ", "port: "+strconv.Itoa(port)+" #", 2)
	}, map[string]string{"foreign.service": foreign})
	if e.cfg.Profiles["coder"].Port != port {
		t.Fatalf("coder port = %d, want %d", e.cfg.Profiles["coder"].Port, port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := e.sd.Systemctl(ctx, "start", "foreign.service"); err != nil {
		t.Fatalf("start foreign.service: %v %s", err, out)
	}
	var foreignPID int
	for foreignPID == 0 {
		if socks, _ := systemd.ListeningOn(port); len(socks) > 0 {
			out, _ := e.sd.Systemctl(ctx, "show", "-P", "MainPID", "foreign.service")
			foreignPID, _ = strconv.Atoi(strings.TrimSpace(out))
		}
		if ctx.Err() != nil {
			t.Fatal("foreign.service does not listen")
		}
		time.Sleep(20 * time.Millisecond)
	}
	evs := e.switchTo(t, "coder")
	ready, ok := stepEvent(evs, "ready", "done")
	if !ok {
		t.Fatalf("no done ready step:%s", describe(evs))
	}
	out, _ := e.sd.Systemctl(ctx, "show", "-P", "MainPID", e.cfg.Backends.VLLM.Unit)
	unitPID, _ := strconv.Atoi(strings.TrimSpace(out))
	if unitPID == 0 || unitPID == foreignPID {
		t.Fatalf("vLLM unit MainPID %d, foreign %d", unitPID, foreignPID)
	}
	// Inside the private systemd's PID namespace the PIDs in the message
	// are those systemctl shows.
	if !strings.Contains(ready.Message, "by PID "+strconv.Itoa(unitPID)+" ") || strings.Contains(ready.Message, "PID "+strconv.Itoa(foreignPID)+" ") {
		t.Errorf("ready step %q: want the unit's PID %d as the listener, not the impersonator's %d", ready.Message, unitPID, foreignPID)
	}
}

// BenchmarkProvePortOwner: the cost the check adds to ready and verify,
// when the unit's main process holds the listener (one look at its open
// files) and when another process does (every process's open files).
func BenchmarkProvePortOwner(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, bc := range []struct {
		name string
		st   api.UnitStatus
	}{
		{"owner", api.UnitStatus{Name: "u.service", MainPID: os.Getpid()}},
		{"foreign", api.UnitStatus{Name: "u.service", MainPID: 1 << 30}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				_, _ = provePortOwner(port, bc.st)
			}
		})
	}
}
