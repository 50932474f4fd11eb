package dovecottest

import (
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2/imapclient"
)

func TestConfigIsSelfContained(t *testing.T) {
	for _, root := range []bool{true, false} {
		conf := config(configParams{
			root: "/t/x", run: "/t/x/run", log: "/t/x/log", passwd: "/t/x/passwd", home: "/t/x/home",
			port: 1143, ids: ids{root: root, internal: "dovecot", login: "dovenull", mail: "mail", mailUID: 8, mailGID: 8},
		})
		for _, bad := range []string{"/etc/dovecot", "/run/dovecot", "/var/lib/dovecot", "!include"} {
			if strings.Contains(conf, bad) {
				t.Errorf("root=%v: config refers to %s:\n%s", root, bad, conf)
			}
		}
		for _, want := range []string{"base_dir = /t/x/run", "ssl = no", "disable_plaintext_auth = no", "address = 127.0.0.1", "port = 1143"} {
			if !strings.Contains(conf, want) {
				t.Errorf("root=%v: config lacks %q:\n%s", root, want, conf)
			}
		}
		if got := strings.Contains(conf, "chroot ="); got == root {
			t.Errorf("root=%v: chroot overrides present=%v, want %v", root, got, !root)
		}
	}
}

func TestServerLifecycle(t *testing.T) {
	s := Start(t, Options{})
	if s.Mailbox != "INBOX" || s.User != "triage" || len(s.Password) < 16 {
		t.Fatalf("defaults: mailbox %q user %q password length %d", s.Mailbox, s.User, len(s.Password))
	}
	raw := []byte("Subject: one\r\n\r\nbody\r\n")
	u1 := s.Append(t, raw)
	u2 := s.Append(t, raw)
	if u1 == 0 || u2 <= u1 {
		t.Fatalf("APPEND UIDs %d, %d: want ascending, non-zero", u1, u2)
	}
	if f := s.Flags(t, u1); f == nil || slices.Contains(f, `\Seen`) {
		t.Fatalf("flags of a fresh mail: %v", f)
	}
	if f := s.Flags(t, 999); f != nil {
		t.Fatalf("flags of a missing mail: %v, want nil", f)
	}

	// A client session dies with Kill, and every Dovecot process is gone.
	c := login(t, s)
	pgid := s.cmd.Process.Pid
	s.Kill()
	if err := c.Noop().Wait(); err == nil {
		t.Fatal("NOOP on a connection to a killed server succeeded")
	}
	if groupAlive(pgid) {
		t.Fatalf("Dovecot processes of group %d survive Kill", pgid)
	}
	if _, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		t.Fatal("port still accepts connections after Kill")
	}

	// Restart keeps the mailbox: the next UID continues.
	s.Restart(t)
	if u3 := s.Append(t, raw); u3 != u2+1 {
		t.Fatalf("UID after restart %d, want %d", u3, u2+1)
	}
	s.Delete(t, u1)
	if f := s.Flags(t, u1); f != nil {
		t.Fatalf("UID %d still there after Delete (flags %v)", u1, f)
	}
	if _, err := os.Stat(s.Maildir + "/cur"); err != nil {
		t.Fatalf("Maildir: %v", err)
	}

	s.Stop()
	s.Stop() // idempotent
	if _, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		t.Fatal("port still accepts connections after Stop")
	}
}

func TestWrongPasswordIsRejected(t *testing.T) {
	s := Start(t, Options{User: "alice", Password: "right-one"})
	s.Password = "wrong-one"
	if c, err := s.login(); err == nil {
		c.Close()
		t.Fatal("login with a wrong password succeeded")
	}
}

func login(t *testing.T, s *Server) *imapclient.Client {
	t.Helper()
	c, err := s.login()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
