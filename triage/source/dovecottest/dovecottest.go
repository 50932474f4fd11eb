// Package dovecottest starts a real Dovecot IMAP server for tests, so the
// triage worker's IMAP code is tested against the server most mailboxes
// actually run, not against a fake that agrees with our own reading of the
// RFCs.
//
// Everything the server needs (config, base_dir with its sockets, state,
// log, passwd-file, Maildir) lives inside the test's t.TempDir(); the
// system's /etc/dovecot and /run/dovecot are never read or written. The
// server listens on a spare 127.0.0.1 port with plaintext login allowed
// (loopback only, ssl = no unless Options.TLS).
package dovecottest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"

	"gpuhost/internal/testkit"
)

// DefaultBinary is where Debian's dovecot-core package installs the server.
const DefaultBinary = "/usr/sbin/dovecot"

// RequireEnv, set to 1, turns a missing Dovecot into a test failure instead
// of a skip, so CI cannot silently stop testing the IMAP path.
const RequireEnv = "GPUHOST_REQUIRE_DOVECOT"

// readyTimeout bounds start-up; generous because CI machines are loaded.
const readyTimeout = 60 * time.Second

// longestSocket is the longest socket path Dovecot 2.3 creates below
// base_dir; with it a unix socket path must stay under 108 bytes.
const longestSocket = "/token-login/imap-urlauth"

// Options shape the server. The zero value is a plain-IMAP server with user
// "triage" and a random password.
type Options struct {
	// User and Password of the one account (defaults: "triage", random).
	User     string
	Password string
	// NoIdle removes IDLE from the advertised capabilities, to test a
	// client's fallback for servers without it.
	NoIdle bool
	// TLS adds a self-signed certificate for 127.0.0.1: STARTTLS on Addr
	// and implicit TLS on TLSAddr.
	TLS bool
}

// Server is a running Dovecot. Its methods must be called from the test
// goroutine (or one at a time).
type Server struct {
	// Addr is the IMAP (plain, or STARTTLS with Options.TLS) host:port.
	Addr string
	// TLSAddr is the implicit-TLS (imaps) host:port; empty without Options.TLS.
	TLSAddr string
	// CertPEM is the server certificate with Options.TLS.
	CertPEM []byte
	// User, Password: the account's credentials.
	User     string
	Password string
	// Mailbox is the mailbox mail is delivered to ("INBOX").
	Mailbox string
	// Dir is the server's root (inside the test's TempDir); Maildir is the
	// INBOX's Maildir folder below it (cur/, new/, tmp/), owned by the mail
	// user.
	Dir     string
	Maildir string

	t       testing.TB
	binary  string
	conf    string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stderr  *bytes.Buffer
	appendC *imapclient.Client
}

// Start starts Dovecot and waits until a login succeeds. It skips the test
// when Dovecot is not installed (unless GPUHOST_REQUIRE_DOVECOT=1) and stops
// the server when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin := findBinary()
	if bin == "" {
		msg := "dovecottest: Dovecot is not installed (" + DefaultBinary + " missing; Debian/Ubuntu: apt-get install dovecot-imapd)"
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg + "; " + RequireEnv + "=1 requires it")
		}
		t.Skip(msg)
	}
	if opts.User == "" {
		opts.User = "triage"
	}
	if opts.Password == "" {
		opts.Password = randomHex(12)
	}
	if strings.ContainsAny(opts.User+opts.Password, ":\n\r\" \t") {
		t.Fatalf("dovecottest: user and password must not contain ':', quotes, blanks or newlines")
	}
	p := serverRoot(t)
	p.noIdle = opts.NoIdle
	s := &Server{
		User:     opts.User,
		Password: opts.Password,
		Mailbox:  "INBOX",
		Dir:      p.root,
		Maildir:  filepath.Join(p.root, "home", "Maildir"),
		t:        t,
		binary:   bin,
		conf:     filepath.Join(p.root, "dovecot.conf"),
		logPath:  filepath.Join(p.root, "dovecot.log"),
	}
	p.log = s.logPath
	s.pickPorts(&p, opts.TLS)
	s.writeConfig(&p)

	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dovecottest: Dovecot log (%s):\n%s", s.logPath, s.Log())
		}
		s.Stop()
	})
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// serverRoot makes the test's temp dir the server's root (checking that a
// Dovecot config and its unix sockets can hold its path) and picks the
// users Dovecot runs as, making the root traversable for them when the
// test runs as root. The configParams returned have root, run and ids.
func serverRoot(t testing.TB) configParams {
	t.Helper()
	root := t.TempDir()
	if strings.ContainsAny(root, "\"\\\n\t %") {
		t.Fatalf("dovecottest: temp dir %q has characters a Dovecot config cannot hold; rename the test", root)
	}
	runDir := filepath.Join(root, "run")
	if len(runDir)+len(longestSocket) >= 108 {
		t.Fatalf("dovecottest: base_dir %s is too long for Dovecot's unix sockets (limit 107 bytes with %s); use a shorter test name or TMPDIR", runDir, longestSocket)
	}
	ids, err := pickUsers()
	if err != nil {
		t.Fatalf("dovecottest: %v", err)
	}
	if ids.root {
		// The mail and auth processes run as unprivileged users; they must be
		// able to traverse the test's temp dirs (created 0700).
		for _, d := range []string{filepath.Dir(root), root} {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatalf("dovecottest: make %s traversable for the mail user: %v", d, err)
			}
		}
	}
	return configParams{root: root, run: runDir, ids: ids}
}

// pickPorts sets s.Addr and, with withTLS, s.TLSAddr and a fresh self-signed
// certificate (s.CertPEM), filling p's ports, cert and key.
func (s *Server) pickPorts(p *configParams, withTLS bool) {
	t := s.t
	t.Helper()
	p.port = testkit.FreePort(t)
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	if withTLS {
		p.tlsPort = testkit.FreePort(t)
		s.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.tlsPort))
		p.cert, p.key = filepath.Join(p.root, "cert.pem"), filepath.Join(p.root, "key.pem")
		var err error
		s.CertPEM, err = writeSelfSigned(p.cert, p.key)
		if err != nil {
			t.Fatalf("dovecottest: %v", err)
		}
	}
}

// writeConfig creates the server's folders and the passwd-file of the one
// account (owned by the users Dovecot runs as, when root), fills p's
// passwd and home, and writes dovecot.conf.
func (s *Server) writeConfig(p *configParams) {
	t := s.t
	t.Helper()
	p.passwd = filepath.Join(p.root, "passwd")
	p.home = filepath.Join(p.root, "home")
	for _, d := range []string{p.run, filepath.Join(p.root, "state"), p.home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("dovecottest: %v", err)
		}
	}
	if err := os.WriteFile(p.passwd, []byte(s.User+":{PLAIN}"+s.Password+"\n"), 0o600); err != nil {
		t.Fatalf("dovecottest: write passwd-file: %v", err)
	}
	if p.ids.root {
		if err := os.Chown(p.passwd, p.ids.internalUID, -1); err != nil {
			t.Fatalf("dovecottest: chown passwd-file to the auth user: %v", err)
		}
		if err := os.Chown(p.home, p.ids.mailUID, p.ids.mailGID); err != nil {
			t.Fatalf("dovecottest: chown mail home to the mail user: %v", err)
		}
	}
	if err := os.WriteFile(s.conf, []byte(config(*p)), 0o644); err != nil {
		t.Fatalf("dovecottest: write config: %v", err)
	}
}

// Log returns the server's log file so far (for failure messages).
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// Append delivers raw through an IMAP APPEND to the mailbox, as a mail
// delivery agent would, and returns the UID Dovecot assigned (UIDPLUS).
// raw should use CRLF line endings, as IMAP requires.
func (s *Server) Append(t testing.TB, raw []byte) uint32 {
	t.Helper()
	var uid uint32
	s.admin(t, "APPEND", func(c *imapclient.Client) error {
		cmd := c.Append(s.Mailbox, int64(len(raw)), nil)
		if _, err := cmd.Write(raw); err != nil {
			cmd.Close()
			return err
		}
		if err := cmd.Close(); err != nil {
			return err
		}
		data, err := cmd.Wait()
		uid = uint32(data.UID)
		return err
	})
	return uid
}

// Delete expunges the mail with uid, as a user's mail client would.
func (s *Server) Delete(t testing.TB, uid uint32) {
	t.Helper()
	s.admin(t, fmt.Sprintf("delete UID %d", uid), func(c *imapclient.Client) error {
		if _, err := c.Select(s.Mailbox, nil).Wait(); err != nil {
			return err
		}
		set := imap.UIDSetNum(imap.UID(uid))
		store := &imap.StoreFlags{Op: imap.StoreFlagsAdd, Silent: true, Flags: []imap.Flag{imap.FlagDeleted}}
		if err := c.Store(set, store, nil).Close(); err != nil {
			return err
		}
		if err := c.UIDExpunge(set).Close(); err != nil {
			return err
		}
		return c.Unselect().Wait()
	})
}

// Flags returns the flags of the mail with uid (nil if there is none), to
// check that a reader left \Seen alone.
func (s *Server) Flags(t testing.TB, uid uint32) []string {
	t.Helper()
	var flags []string
	s.admin(t, fmt.Sprintf("flags of UID %d", uid), func(c *imapclient.Client) error {
		if _, err := c.Select(s.Mailbox, &imap.SelectOptions{ReadOnly: true}).Wait(); err != nil {
			return err
		}
		msgs, err := c.Fetch(imap.UIDSetNum(imap.UID(uid)), &imap.FetchOptions{UID: true, Flags: true}).Collect()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if uint32(m.UID) == uid {
				flags = []string{}
				for _, f := range m.Flags {
					flags = append(flags, string(f))
				}
			}
		}
		return c.Unselect().Wait()
	})
	return flags
}

// admin runs fn on the harness's own logged-in connection (opened on first
// use, reopened once if it broke, e.g. after Kill or Restart).
func (s *Server) admin(t testing.TB, what string, fn func(c *imapclient.Client) error) {
	t.Helper()
	try := func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.appendC == nil {
			c, err := s.login()
			if err != nil {
				return err
			}
			s.appendC = c
		}
		done := make(chan error, 1)
		go func() { done <- fn(s.appendC) }()
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second):
			s.appendC.Close()
			<-done
			return errors.New("no answer within 60s")
		}
	}
	err := try()
	if err != nil {
		s.dropAppendClient()
		err = try()
	}
	if err != nil {
		t.Fatalf("dovecottest: %s in %s at %s: %v", what, s.Mailbox, s.Addr, err)
	}
}

func (s *Server) dropAppendClient() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.appendC != nil {
		s.appendC.Close()
		s.appendC = nil
	}
}

// login opens an authenticated connection with a 30 s bound on each step.
func (s *Server) login() (*imapclient.Client, error) {
	conn, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := imapclient.New(conn, nil)
	done := make(chan error, 1)
	go func() {
		if err := c.WaitGreeting(); err != nil {
			done <- err
			return
		}
		done <- c.Login(s.User, s.Password).Wait()
	}()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		err = errors.New("no login answer within 30s")
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Stop shuts Dovecot down (SIGTERM, then SIGKILL to its process group after
// 10 s). Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.dropAppendClient()
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
	// Children that outlive the master (or a master that ignored SIGTERM).
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
	waitGroupGone(cmd.Process.Pid)
}

// Kill SIGKILLs Dovecot and all its processes at once, so open client
// connections drop as they would when a server crashes.
func (s *Server) Kill() {
	s.dropAppendClient()
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
	waitGroupGone(cmd.Process.Pid)
}

// waitGroupGone waits (up to 10 s) until no live process is left in the
// process group, so the port and the mail files are free when Kill or Stop
// return. Zombies waiting for a reaper do not count.
func waitGroupGone(pgid int) {
	deadline := time.Now().Add(10 * time.Second)
	for groupAlive(pgid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// groupAlive reports whether a non-zombie process is in group pgid.
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // no /proc: trust the signal probe
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 3 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// Restart stops the server if it runs and starts it again on the same port
// with the same mailbox (UIDs and UIDVALIDITY survive, as on a real server).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// start runs `dovecot -F -c conf` in its own process group and waits until
// a login works.
func (s *Server) start() error {
	var stderr bytes.Buffer
	cmd := exec.Command(s.binary, "-F", "-c", s.conf)
	cmd.Dir = s.Dir
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dovecottest: start %s: %w", s.binary, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited, s.stderr = cmd, exited, &stderr
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var lastErr error
	for {
		c, err := s.login()
		if err == nil {
			_ = c.Logout().Wait()
			c.Close()
			return nil
		}
		lastErr = err
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("dovecottest: dovecot -F -c %s exited during start-up (%v)\noutput:\n%s\nlog:\n%s",
				s.conf, cmd.ProcessState, stderr.String(), s.Log())
		case <-ctx.Done():
			s.Kill()
			return fmt.Errorf("dovecottest: no IMAP login at %s within %s: %v\noutput:\n%s\nlog:\n%s",
				s.Addr, readyTimeout, lastErr, stderr.String(), s.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func findBinary() string {
	if st, err := os.Stat(DefaultBinary); err == nil && !st.IsDir() {
		return DefaultBinary
	}
	if p, err := exec.LookPath("dovecot"); err == nil {
		return p
	}
	return ""
}

// ids are the system users Dovecot's processes run as.
type ids struct {
	root bool
	// internal runs auth and the other helpers, login the pre-login
	// process, mail the IMAP session (never uid 0: Dovecot refuses it).
	internal, login, mail string
	// group owns the sockets shared between services (non-root only;
	// as root Dovecot's default, "dovecot").
	group            string
	internalUID      int
	mailUID, mailGID int
}

// pickUsers chooses the users. As root: dovecot/dovenull (created by
// Debian's dovecot-core) for the services and mail (uid 8) for mail access,
// each falling back to nobody. As anyone else: the current user for all,
// which Dovecot accepts when it does not need to switch users.
func pickUsers() (ids, error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return ids{}, fmt.Errorf("look up the current user: %w", err)
		}
		g, err := user.LookupGroupId(u.Gid)
		if err != nil {
			return ids{}, fmt.Errorf("look up the current group %s: %w", u.Gid, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return ids{internal: u.Username, login: u.Username, mail: u.Username, group: g.Name,
			internalUID: uid, mailUID: uid, mailGID: gid}, nil
	}
	first := func(names ...string) (*user.User, error) {
		var err error
		for _, n := range names {
			var u *user.User
			if u, err = user.Lookup(n); err == nil && u.Uid != "0" {
				return u, nil
			}
		}
		return nil, fmt.Errorf("none of the users %v exists: %v", names, err)
	}
	internal, err := first("dovecot", "nobody")
	if err != nil {
		return ids{}, err
	}
	login, err := first("dovenull", "nobody")
	if err != nil {
		return ids{}, err
	}
	mail, err := first("mail", "nobody")
	if err != nil {
		return ids{}, err
	}
	iu, _ := strconv.Atoi(internal.Uid)
	mu, _ := strconv.Atoi(mail.Uid)
	mg, _ := strconv.Atoi(mail.Gid)
	return ids{root: true, internal: internal.Username, login: login.Username, mail: mail.Username,
		internalUID: iu, mailUID: mu, mailGID: mg}, nil
}

type configParams struct {
	root, run, log, passwd, home string
	port, tlsPort                int
	cert, key                    string
	ids                          ids
	noIdle                       bool
}

// config is a complete dovecot.conf: nothing is included from /etc/dovecot.
func config(p configParams) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# Written by gpuhost's dovecottest for one test; removed with it.")
	w("base_dir = %s", p.run)
	w("state_dir = %s", filepath.Join(p.root, "state"))
	w("log_path = %s", p.log)
	w("protocols = imap")
	w("listen = 127.0.0.1")
	w("disable_plaintext_auth = no")
	w("auth_mechanisms = plain login")
	w("default_internal_user = %s", p.ids.internal)
	w("default_login_user = %s", p.ids.login)
	if p.ids.group != "" {
		w("default_internal_group = %s", p.ids.group)
	}
	w("first_valid_uid = %d", p.ids.mailUID)
	w("first_valid_gid = %d", p.ids.mailGID)
	w("mail_location = maildir:~/Maildir")
	// IDLE notices new mail by inotify; where that is unavailable, check
	// every second rather than the default 30 s.
	w("mailbox_idle_check_interval = 1s")
	if p.noIdle {
		w("imap_capability = IMAP4rev1 SASL-IR LOGIN-REFERRALS ID ENABLE LITERAL+ UIDPLUS UNSELECT")
	}
	if p.tlsPort != 0 {
		w("ssl = yes")
		w("ssl_cert = <%s", p.cert)
		w("ssl_key = <%s", p.key)
	} else {
		w("ssl = no")
	}
	w("passdb {\n  driver = passwd-file\n  args = scheme=PLAIN %s\n}", p.passwd)
	w("userdb {\n  driver = static\n  args = uid=%d gid=%d home=%s\n}", p.ids.mailUID, p.ids.mailGID, p.home)
	w("service imap-login {")
	w("  inet_listener imap {\n    address = 127.0.0.1\n    port = %d\n  }", p.port)
	w("  inet_listener imaps {\n    address = 127.0.0.1\n    port = %d\n  }", p.tlsPort)
	if !p.ids.root {
		w("  chroot =")
	}
	w("}")
	if !p.ids.root {
		// Without root, Dovecot cannot chroot its helpers.
		for _, svc := range []string{"anvil", "imap-urlauth-login", "ipc", "old-stats", "aggregator", "director", "pop3-login", "submission-login"} {
			w("service %s {\n  chroot =\n}", svc)
		}
	}
	return b.String()
}

// writeSelfSigned writes a certificate for 127.0.0.1 and its key.
func writeSelfSigned(certPath, keyPath string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate TLS key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "dovecottest"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create TLS certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal TLS key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", certPath, err)
	}
	// Dovecot's master reads the key as root before dropping privileges.
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", keyPath, err)
	}
	return certPEM, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // documented never to fail (it crashes the program instead)
	return hex.EncodeToString(b)
}
