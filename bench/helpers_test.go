package bench

import (
	"bytes"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
)

// startSim runs the real simulator in-process (simtest.Start).
func startSim(t testing.TB, o simulator.Options) string { return simtest.Start(t, o) }

// startSimProcess runs the simulator as its own process (the real gpuhost
// binary), so that timing tests measure a server that is not slowed down by
// the race detector or by sharing the test's Go runtime.
func startSimProcess(t testing.TB, args ...string) string {
	t.Helper()
	bin := testbin.Binary(t)
	port := testkit.FreePort(t)
	cmd := exec.Command(bin, append(append([]string{"simulate"}, args...), "--port", strconv.Itoa(port), "--log-level", "warn")...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			t.Fatalf("simulator exited: %v\n%s", err, logs.String())
		default:
		}
		if resp, err := http.Get(url + "/v1/models"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("simulator did not answer within 30s\n%s", logs.String())
	return ""
}
