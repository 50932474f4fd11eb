package triage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
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
// 300 mails from a real Dovecot, classifies them on the simulator (through
// a proxy here that counts the model calls) and posts them to a fake Slack
// in this process, and is restarted until all are done. Every mail must
// reach Slack exactly once, the in-flight check must have been used, the
// checkpoint must end at the last UID, and the spend must match the tally:
// the model was asked once per mail plus at most the calls the tally names
// as repeats (a kill while a call ran), never more.
func TestDovecotCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: runs Dovecot, the simulator and a worker process")
	}
	const mails = 300
	start := time.Now()
	srv := dovecottest.Start(t, dovecottest.Options{})
	bin := testbin.Binary(t)
	// Decoding at 3,000 tok/s makes each call last some ms, so that kills
	// land while calls run as well as between them.
	simBase := simtest.Start(t, simulator.Options{
		Flavor: simulator.FlavorVLLM, Model: simModel,
		LoadTime: time.Nanosecond, PrefillTPS: 2e6, DecodeTPS: 3000, MaxNumSeqs: 64,
	})
	var modelCalls atomic.Int64
	simURL := countingProxy(t, simBase, &modelCalls) + "/v1"
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
	deadline := time.Now().Add(6 * time.Minute)
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
			// A third of the rounds kill at a random time; a third as soon
			// as the checkpoint shows a model call started (plus a random
			// few ms: during the call or just after it, the window where
			// a reply could be lost or paid twice); a third as soon as it
			// shows a judged mail in flight, the window the Slack check
			// closes.
			var killAt <-chan time.Time
			if round%3 == 1 {
				killAt = time.After(time.Duration(50+rng.IntN(400)) * time.Millisecond)
			}
			inWindow := func(in *Inflight) bool {
				if round%3 == 0 {
					return in.Judged == nil && len(in.Calls) > 0
				}
				return in.Judged != nil
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
					if err == nil && c.Inflight != nil && !c.Updated.Equal(before.Updated) && inWindow(c.Inflight) {
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
	var tally DayCost
	for _, d := range c.Costs {
		tally.Mails += d.Mails
		tally.Calls += d.Calls
		tally.Repeats += d.Repeats
	}
	asked := int(modelCalls.Load())
	// Each mail is classified in one call (the simulator's replies are
	// valid). A repeat is counted when a restart finds a call started and
	// not finished: the kill came after the record was written, and the
	// request may or may not have left before it.
	if tally.Mails != mails || tally.Calls != mails {
		t.Errorf("tally: %d mails, %d calls; want %d of each (each mail classified once)", tally.Mails, tally.Calls, mails)
	}
	if asked < tally.Calls || asked > tally.Calls+tally.Repeats {
		t.Errorf("the model was asked %d times; the tally says %d calls + %d repeats (spend must lie within)", asked, tally.Calls, tally.Repeats)
	}
	t.Logf("crash test: %d mails, %d kills (%d with a mail in flight), %d restarts, %d Slack history calls, %d duplicates, %d missing; model asked %d times, tally %d mails, %d calls, %d repeats; %s",
		mails, kills, inflightKills, restarts, fake.HistoryCalls(), duplicates, missing, asked, tally.Mails, tally.Calls, tally.Repeats, time.Since(start).Round(time.Millisecond))
}

// countingProxy forwards to base and counts the chat completions asked.
func countingProxy(t *testing.T, base string, n *atomic.Int64) string {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0) // a killed worker's call ends as "context canceled"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/chat/completions") {
			n.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
