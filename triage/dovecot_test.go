package triage

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
	"gpuhost/triage/source"
	"gpuhost/triage/source/dovecottest"
)

func imapSource(srv *dovecottest.Server) *source.IMAP {
	pw := srv.Password
	return source.NewIMAP(source.IMAPOptions{
		Addr: srv.Addr, Security: "plain", Username: srv.User,
		Password: func() (string, error) { return pw, nil },
		Mailbox:  srv.Mailbox, Timeout: 10 * time.Second,
	})
}

// TestDovecotNewMailOnceInOrder: against a real Dovecot, each new mail is
// processed exactly once and in UID order, across polls, a restart of the
// worker, and a server that goes away and comes back.
func TestDovecotNewMailOnceInOrder(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	rec := &recSink{name: "rec"}
	dir := t.TempDir()
	newWorker := func() *Worker {
		w, err := New(Options{Source: imapSource(srv), Classifier: &fakeClassifier{}, Sinks: []sink.Sink{rec},
			StateDir: dir, Log: testLogger(t), AlertFailures: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	w := newWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var want []string
	deliver := func(n int) {
		for range n {
			s := fmt.Sprintf("mail %02d", len(want)+1)
			srv.Append(t, []byte(eml("ann@customer.test", "sales@example.com", s, "body")))
			want = append(want, s)
		}
	}
	poll := func(wantN int) {
		t.Helper()
		n, err := w.Once(ctx)
		if err != nil || n != wantN {
			t.Fatalf("Once = %d, %v; want %d", n, err, wantN)
		}
	}
	deliver(3)
	poll(3)
	poll(0)
	deliver(2)
	poll(2)
	w.Close()
	w = newWorker() // a restart resumes after the checkpoint
	deliver(1)
	poll(1)
	srv.Kill()
	if _, err := w.Once(ctx); err == nil {
		t.Fatal("Once succeeded with Dovecot killed")
	}
	srv.Restart(t)
	deliver(1)
	poll(1)
	var got []string
	for _, p := range rec.Posts() {
		got = append(got, p.Subject)
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("posted\n  %q\nwant\n  %q", got, want)
	}
}

// TestDovecotCrashKill is the crash test: a worker process
// (`gpuhost triage run`) is SIGKILLed at random points while it processes
// 200 mails from a real Dovecot, classifies them on the simulator and posts
// them to a fake Slack in this process, and is restarted until all are
// done. Every mail must reach Slack exactly once, the in-flight check must
// have been used, and the checkpoint must end at the last UID.
func TestDovecotCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: runs Dovecot, the simulator and a worker process")
	}
	const mails = 200
	start := time.Now()
	srv := dovecottest.Start(t, dovecottest.Options{})
	bin := testbin.Binary(t)
	simURL := startSim(t, "", "")
	fake := slacktest.New(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	cfgPath := filepath.Join(dir, "gpuhost.yaml")
	cfg := testbin.ConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms") + fmt.Sprintf(`
triage:
  enabled: true
  interval: 100ms
  first_run: all
  source:
    kind: imap
    addr: %s
    security: plain
    username: %s
    password_env: TRIAGE_TEST_IMAP_PASSWORD
    timeout: 10s
  model:
    base_url: %s
    model: %s
    timeout: 20s
  transcription:
    disabled: true
  slack:
    enabled: true
    token_env: TRIAGE_TEST_SLACK_TOKEN
    api_url: %s
    channel: C0TRIAGE
  alerting:
    failures_before_alert: 1000
`, srv.Addr, srv.User, simURL, simModel, fake.URL())
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	name := imapSource(srv).Name()
	ckpt := checkpointPath(state, name)

	// Mail arrives while the worker runs and is killed: a first chunk
	// before it starts, then a chunk at the start of every round.
	var (
		lastUID  uint32
		appended int
	)
	deliver := func(n int) {
		for ; n > 0 && appended < mails; n-- {
			lastUID = srv.Append(t, []byte(eml(fmt.Sprintf("sender%03d@customer.test", appended), "sales@example.com",
				fmt.Sprintf("crash test mail %03d about an order", appended), "Please confirm the order.")))
			appended++
		}
	}
	deliver(40)

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0x7269616765))
	t.Logf("kill schedule seed %d", seed)
	env := append(os.Environ(), "TRIAGE_TEST_IMAP_PASSWORD="+srv.Password, "TRIAGE_TEST_SLACK_TOKEN="+fake.Token())
	read := func() Checkpoint {
		c, err := loadCheckpoint(ckpt)
		if err != nil {
			t.Fatalf("checkpoint unreadable after a kill: %v", err)
		}
		return c
	}
	done := func(c Checkpoint) bool { return appended == mails && c.LastUID == lastUID && c.Inflight == nil }

	var (
		kills, inflightKills, restarts int
		logs                           bytes.Buffer
	)
	deadline := time.Now().Add(3 * time.Minute)
	for round := 0; ; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("not done after %d rounds (checkpoint %+v)\n%s", round, read(), tail(logs.String(), 4000))
		}
		cmd := exec.Command(bin, "triage", "run", "--config", cfgPath, "--log-level", "warn")
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if round > 0 {
			restarts++
		}
		before := read()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		deliver(20)
		final := round >= 30 && appended == mails // enough killing: let it finish
		if !final {
			// Odd rounds kill at a random time; even rounds as soon as the
			// checkpoint shows a mail in flight (plus a random few ms), so
			// the window the Slack check closes is hit for sure.
			var killAt <-chan time.Time
			if round%2 == 1 {
				killAt = time.After(time.Duration(50+rng.IntN(400)) * time.Millisecond)
			}
			tick := time.NewTicker(time.Millisecond)
		wait:
			for {
				select {
				case err := <-exited:
					tick.Stop()
					t.Fatalf("worker exited on its own: %v\n%s", err, out.String())
				case <-killAt:
					break wait
				case <-tick.C:
					if killAt != nil {
						continue
					}
					c, err := loadCheckpoint(ckpt)
					if err == nil && c.Inflight != nil && !c.Updated.Equal(before.Updated) {
						// This process marked a mail in flight.
						time.Sleep(time.Duration(rng.IntN(4)) * time.Millisecond)
						break wait
					}
					if err == nil && done(c) {
						break wait
					}
				}
			}
			tick.Stop()
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			kills++
			logs.WriteString(out.String())
			c := read()
			if c.Inflight != nil && !c.Updated.Equal(before.Updated) {
				inflightKills++
			}
			if done(c) {
				break
			}
			continue
		}
		// Final round: wait until everything is through, then stop it
		// cleanly with SIGTERM.
		for !done(read()) {
			select {
			case err := <-exited:
				t.Fatalf("worker exited on its own: %v\n%s", err, out.String())
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("final run did not finish (checkpoint %+v)\n%s", read(), out.String())
			}
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("worker did not exit cleanly on SIGTERM: %v\n%s", err, out.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("worker ignored SIGTERM for 30s")
		}
		break
	}

	c := read()
	duplicates, missing := 0, 0
	for uid := lastUID - mails + 1; uid <= lastUID; uid++ {
		switch n := fake.CountKey(Key(name, c.UIDValidity, uid)); {
		case n == 0:
			missing++
			t.Errorf("UID %d never reached Slack", uid)
		case n > 1:
			duplicates += n - 1
			t.Errorf("UID %d reached Slack %d times", uid, n)
		}
	}
	if got := len(fake.All()); got != mails {
		t.Errorf("Slack holds %d messages, want %d", got, mails)
	}
	if c.LastUID != lastUID || c.Inflight != nil {
		t.Errorf("checkpoint %+v, want last_uid %d and nothing in flight", c, lastUID)
	}
	if inflightKills == 0 {
		t.Error("no kill landed while a mail was in flight; the Slack check was not exercised")
	}
	if fake.HistoryCalls() == 0 {
		t.Errorf("%d kills left a mail in flight but Slack's history was never read", inflightKills)
	}
	t.Logf("crash test: %d mails, %d kills (%d with a mail in flight), %d restarts, %d Slack history calls, %d duplicates, %d missing, %s",
		mails, kills, inflightKills, restarts, fake.HistoryCalls(), duplicates, missing, time.Since(start).Round(time.Millisecond))
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
