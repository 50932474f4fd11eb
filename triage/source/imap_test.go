package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"

	"gpuhost/internal/testkit"
	"gpuhost/triage/source/dovecottest"
)

// testMail is a small CRLF mail; n makes it unique.
func testMail(n int) []byte {
	return fmt.Appendf(nil, "From: sender%d@example.com\r\nTo: triage@example.com\r\nSubject: mail %d\r\nMessage-ID: <%d@example.com>\r\n\r\nBody of mail %d.\r\n", n, n, n, n)
}

// bigMail has a short header and a body of about size bytes.
func bigMail(size int) (raw, header []byte) {
	header = []byte("From: big@example.com\r\nSubject: large attachment\r\n\r\n")
	line := strings.Repeat("x", 76) + "\r\n"
	body := strings.Repeat(line, size/len(line)+1)
	return append(slices.Clone(header), body...), header
}

func newIMAPFor(s *dovecottest.Server, mod func(*IMAPOptions)) *IMAP {
	opts := IMAPOptions{
		Addr:     s.Addr,
		Security: "plain",
		Username: s.User,
		Password: func() (string, error) { return s.Password, nil },
		Mailbox:  s.Mailbox,
		Timeout:  30 * time.Second,
	}
	if mod != nil {
		mod(&opts)
	}
	return NewIMAP(opts)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func uidsOf(mails []Mail) []uint32 {
	var out []uint32
	for _, m := range mails {
		out = append(out, m.UID)
	}
	return out
}

func TestIMAPFetch(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	src := newIMAPFor(srv, nil)
	t.Cleanup(func() { src.Close() })
	ctx := ctxT(t)

	if got, want := src.Name(), "imap://"+srv.User+"@"+srv.Addr+"/INBOX"; got != want {
		t.Errorf("Name() = %q, want %q", got, want)
	}

	empty, err := src.Fetch(ctx, 0, 10, 0)
	if err != nil {
		t.Fatalf("Fetch on an empty mailbox: %v", err)
	}
	if empty.UIDValidity == 0 || empty.HighestUID != 0 || len(empty.Mails) != 0 {
		t.Fatalf("empty mailbox: %+v, want UIDVALIDITY set, no mails", empty)
	}

	var uids []uint32
	raws := map[uint32][]byte{}
	for i := range 5 {
		raw := testMail(i)
		uid := srv.Append(t, raw)
		uids = append(uids, uid)
		raws[uid] = raw
	}
	big, bigHeader := bigMail(300 << 10)
	bigUID := srv.Append(t, big)

	tests := []struct {
		name       string
		after      uint32
		limit      int
		maxBytes   int64
		want       []uint32
		headerOnly []uint32
	}{
		{"all, no limits", 0, 0, 0, append(slices.Clone(uids), bigUID), nil},
		{"limit keeps the oldest", 0, 2, 0, uids[:2], nil},
		{"after a checkpoint", uids[2], 10, 0, []uint32{uids[3], uids[4], bigUID}, nil},
		{"after and limit", uids[1], 1, 0, []uint32{uids[2]}, nil},
		{"large mail header only", uids[4], 10, 100 << 10, []uint32{bigUID}, []uint32{bigUID}},
		{"maxBytes between sizes", 0, 0, 1 << 10, append(slices.Clone(uids), bigUID), []uint32{bigUID}},
		{"nothing new", bigUID, 10, 0, nil, nil},
		{"after beyond everything", bigUID + 100, 10, 0, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := src.Fetch(ctx, tc.after, tc.limit, tc.maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			if b.UIDValidity != empty.UIDValidity {
				t.Errorf("UIDVALIDITY %d, want %d", b.UIDValidity, empty.UIDValidity)
			}
			if b.HighestUID != bigUID {
				t.Errorf("HighestUID %d, want %d", b.HighestUID, bigUID)
			}
			if got := uidsOf(b.Mails); !slices.Equal(got, tc.want) {
				t.Fatalf("UIDs %v, want %v", got, tc.want)
			}
			for _, m := range b.Mails {
				wantHO := slices.Contains(tc.headerOnly, m.UID)
				if m.HeaderOnly != wantHO {
					t.Errorf("UID %d HeaderOnly=%v, want %v", m.UID, m.HeaderOnly, wantHO)
				}
				switch {
				case m.UID == bigUID && wantHO:
					if !bytes.Equal(m.Raw, bigHeader) {
						t.Errorf("header of the large mail: %q, want %q", m.Raw, bigHeader)
					}
					if m.Size != int64(len(big)) {
						t.Errorf("large mail Size %d, want %d", m.Size, len(big))
					}
				case m.UID == bigUID:
					if !bytes.Equal(m.Raw, big) {
						t.Errorf("large mail body differs (%d bytes, want %d)", len(m.Raw), len(big))
					}
				default:
					if !bytes.Equal(m.Raw, raws[m.UID]) || m.Size != int64(len(raws[m.UID])) {
						t.Errorf("UID %d: Raw %q Size %d, want %q", m.UID, m.Raw, m.Size, raws[m.UID])
					}
				}
			}
		})
	}

	t.Run("Get", func(t *testing.T) {
		m, err := src.Get(ctx, uids[1], 0)
		if err != nil || m.UID != uids[1] || !bytes.Equal(m.Raw, raws[uids[1]]) || m.HeaderOnly {
			t.Fatalf("Get(%d) = %+v, %v", uids[1], m, err)
		}
		m, err = src.Get(ctx, bigUID, 1<<10)
		if err != nil || !m.HeaderOnly || !bytes.Equal(m.Raw, bigHeader) {
			t.Fatalf("Get(large, 1 KiB) = HeaderOnly %v Raw %q, %v", m.HeaderOnly, m.Raw, err)
		}
		for _, uid := range []uint32{0, bigUID + 1, 1 << 30} {
			if _, err := src.Get(ctx, uid, 0); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get(%d): %v, want ErrNotFound", uid, err)
			}
		}
	})

	t.Run("never sets Seen", func(t *testing.T) {
		for _, uid := range append(slices.Clone(uids), bigUID) {
			if f := srv.Flags(t, uid); slices.Contains(f, `\Seen`) {
				t.Errorf("UID %d has flags %v after fetching: the source must only peek", uid, f)
			}
		}
	})

	// "UID FETCH N:*" returns the last message even when its UID is below
	// N. With the newest mail expunged, UIDNEXT-1 is above the last UID, so
	// a checkpoint at the last UID asks for exactly that case.
	t.Run("N:* quirk", func(t *testing.T) {
		srv.Delete(t, bigUID)
		b, err := src.Fetch(ctx, uids[4], 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Mails) != 0 {
			t.Fatalf("Fetch after UID %d returned %v; the last message (UID %d) must be filtered", uids[4], uidsOf(b.Mails), uids[4])
		}
		if b.HighestUID != bigUID {
			t.Errorf("HighestUID %d, want UIDNEXT-1 = %d", b.HighestUID, bigUID)
		}
		if _, err := src.Get(ctx, bigUID, 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(expunged): %v, want ErrNotFound", err)
		}
	})

	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Fetch(ctx, 0, 1, 0); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Fetch after Close: %v, want net.ErrClosed", err)
	}
}

func TestIMAPReconnectsAfterServerCrash(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	var reads atomic.Int32
	src := newIMAPFor(srv, func(o *IMAPOptions) {
		o.Password = func() (string, error) { reads.Add(1); return srv.Password, nil }
	})
	t.Cleanup(func() { src.Close() })
	ctx := ctxT(t)

	first := srv.Append(t, testMail(1))
	b1, err := src.Fetch(ctx, 0, 10, 0)
	if err != nil || !slices.Equal(uidsOf(b1.Mails), []uint32{first}) {
		t.Fatalf("first Fetch: %v, %v", uidsOf(b1.Mails), err)
	}

	srv.Kill()
	_, err = src.Fetch(ctx, first, 10, 0)
	if err == nil {
		t.Fatal("Fetch from a killed server succeeded")
	}
	if !strings.Contains(err.Error(), srv.Addr) {
		t.Errorf("error %q does not name the server %s", err, srv.Addr)
	}
	if strings.Contains(err.Error(), srv.Password) {
		t.Errorf("error %q contains the password", err)
	}

	srv.Restart(t)
	second := srv.Append(t, testMail(2))
	b2, err := src.Fetch(ctx, first, 10, 0)
	if err != nil {
		t.Fatalf("Fetch after restart did not reconnect: %v", err)
	}
	if !slices.Equal(uidsOf(b2.Mails), []uint32{second}) || b2.UIDValidity != b1.UIDValidity {
		t.Fatalf("after restart: UIDs %v UIDVALIDITY %d, want [%d] and %d", uidsOf(b2.Mails), b2.UIDValidity, second, b1.UIDValidity)
	}
	if n := reads.Load(); n < 2 {
		t.Errorf("password read %d times; it must be read at each connect", n)
	}
}

func TestIMAPIdleWakesWait(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	src := newIMAPFor(srv, nil)
	t.Cleanup(func() { src.Close() })
	ctx := ctxT(t)
	idling := make(chan struct{}, 1)
	src.onIdle = func() { idling <- struct{}{} }

	b, err := src.Fetch(ctx, 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !src.canIdle {
		t.Fatal("Dovecot advertises IDLE but the source did not notice")
	}

	// d is far beyond the test's deadline: only the new mail can end Wait
	// without an error.
	waited := make(chan error, 1)
	go func() { waited <- src.Wait(ctx, time.Hour) }()
	select {
	case <-idling:
	case err := <-waited:
		t.Fatalf("Wait returned before IDLE started: %v", err)
	}
	uid := srv.Append(t, testMail(7))
	if err := <-waited; err != nil {
		t.Fatalf("Wait did not wake on new mail (IDLE): %v", err)
	}
	b2, err := src.Fetch(ctx, b.HighestUID, 10, 0)
	if err != nil || !slices.Equal(uidsOf(b2.Mails), []uint32{uid}) {
		t.Fatalf("Fetch after wake: %v, %v; want [%d]", uidsOf(b2.Mails), err, uid)
	}

	t.Run("Get interrupts IDLE", func(t *testing.T) {
		go func() { waited <- src.Wait(ctx, time.Hour) }()
		<-idling
		m, err := src.Get(ctx, uid, 0)
		if err != nil || m.UID != uid {
			t.Fatalf("Get during IDLE: %+v, %v", m, err)
		}
		if err := <-waited; err != nil {
			t.Fatalf("Wait interrupted by Get: %v, want nil", err)
		}
	})

	t.Run("ctx ends Wait", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		go func() { waited <- src.Wait(wctx, time.Hour) }()
		<-idling
		cancel()
		if err := <-waited; !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
		}
		if _, err := src.Fetch(ctx, uid, 10, 0); err != nil {
			t.Fatalf("Fetch after a cancelled IDLE: %v", err)
		}
	})

	t.Run("server crash ends Wait", func(t *testing.T) {
		go func() { waited <- src.Wait(ctx, time.Hour) }()
		<-idling
		srv.Kill()
		if err := <-waited; err != nil {
			t.Fatalf("Wait on a dropped connection: %v, want nil (the next Fetch reports)", err)
		}
		if _, err := src.Fetch(ctx, uid, 10, 0); err == nil {
			t.Fatal("Fetch from a killed server succeeded")
		}
	})
}

func TestIMAPWaitWithoutIdleSleeps(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{NoIdle: true})
	src := newIMAPFor(srv, nil)
	t.Cleanup(func() { src.Close() })
	ctx := ctxT(t)
	src.onIdle = func() { t.Error("IDLE sent to a server without the capability") }
	if _, err := src.Fetch(ctx, 0, 10, 0); err != nil {
		t.Fatal(err)
	}
	if src.canIdle {
		t.Fatal("canIdle on a server that does not advertise IDLE")
	}
	start := time.Now()
	if err := src.Wait(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("Wait returned after %s, before d", el)
	}
	wctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := src.Wait(wctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled ctx: %v", err)
	}
}

func TestIMAPLoginErrors(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	ctx := ctxT(t)
	const wrong = "not-the-password-4711"
	tests := []struct {
		name     string
		password func() (string, error)
		want     error
		wantText string
	}{
		{"wrong password", func() (string, error) { return wrong, nil }, ErrAuthFailed, "LOGIN as " + srv.User},
		{"password source fails", func() (string, error) { return "", errors.New("TRIAGE_IMAP_PASSWORD is not set") }, nil, "read password: TRIAGE_IMAP_PASSWORD is not set"},
		{"empty password", func() (string, error) { return "", nil }, nil, "password is empty"},
		{"no password source", nil, nil, "no password source"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := newIMAPFor(srv, func(o *IMAPOptions) { o.Password = tc.password })
			defer src.Close()
			_, err := src.Fetch(ctx, 0, 10, 0)
			if err == nil {
				t.Fatal("Fetch succeeded")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v is not %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.wantText) || !strings.Contains(err.Error(), srv.Addr) {
				t.Errorf("error %q lacks %q or the address", err, tc.wantText)
			}
			for _, secret := range []string{wrong, srv.Password} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q contains a password", err)
				}
			}
		})
	}
}

func TestIMAPTLS(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{TLS: true})
	ctx := ctxT(t)
	uid := srv.Append(t, testMail(1))
	tests := []struct {
		name     string
		addr     string
		security string
		skip     bool
		wantErr  string
	}{
		{"implicit TLS", srv.TLSAddr, "tls", true, ""},
		{"STARTTLS", srv.Addr, "starttls", true, ""},
		{"implicit TLS verifies the certificate", srv.TLSAddr, "tls", false, "certificate"},
		{"STARTTLS verifies the certificate", srv.Addr, "starttls", false, "certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := newIMAPFor(srv, func(o *IMAPOptions) {
				o.Addr, o.Security, o.InsecureSkipVerify = tc.addr, tc.security, tc.skip
			})
			defer src.Close()
			b, err := src.Fetch(ctx, 0, 10, 0)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Fetch: %v, want an error about %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(uidsOf(b.Mails), []uint32{uid}) {
				t.Fatalf("Fetch: %v, %v", uidsOf(b.Mails), err)
			}
		})
	}
}

func TestIMAPConnectErrors(t *testing.T) {
	ctx := ctxT(t)
	// A server that accepts and then says nothing (a hung server).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	closedAddr := testkit.FreeAddr(t)
	_, closedPort, _ := net.SplitHostPort(closedAddr)

	tests := []struct {
		name, addr, security, want string
	}{
		{"nothing listening", closedAddr, "plain", "connect"},
		{"silent server", ln.Addr().String(), "plain", "greeting: no answer within"},
		{"silent server, TLS", ln.Addr().String(), "tls", "TLS handshake"},
		{"plain to a remote address", "192.0.2.1:143", "plain", "only to a loopback address"},
		// loopback.DialsLoopback: localhost in any case, no name under
		// .localhost (DNS may answer it with any address).
		{"plain to LOCALHOST", "LOCALHOST:" + closedPort, "plain", "connect"},
		{"plain to a .localhost name", "mail.localhost:143", "plain", "only to a loopback address"},
		{"unknown security", "127.0.0.1:143", "ssl", `"ssl" is not tls, starttls or plain`},
		{"not host:port", "127.0.0.1", "plain", "not host:port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := NewIMAP(IMAPOptions{
				Addr: tc.addr, Security: tc.security, Username: "u",
				Password: func() (string, error) { return "pw-secret", nil },
				Timeout:  300 * time.Millisecond,
			})
			defer src.Close()
			_, err := src.Fetch(ctx, 0, 1, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Fetch: %v, want an error containing %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "imap://u@") || strings.Contains(err.Error(), "pw-secret") {
				t.Errorf("error %q must name the source and not hold the password", err)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	tests := []struct {
		err      error
		password string
		want     string
		auth     bool
	}{
		{errors.New("server said hunter2"), "hunter2", "server said [redacted]", false},
		{fmt.Errorf("%w: NO hunter2", ErrAuthFailed), "hunter2", ErrAuthFailed.Error() + ": NO [redacted]", true},
		{errors.New("plain failure"), "hunter2", "plain failure", false},
		{errors.New("anything"), "", "anything", false},
	}
	for _, tc := range tests {
		got := redact(tc.err, tc.password)
		if got.Error() != tc.want || errors.Is(got, ErrAuthFailed) != tc.auth {
			t.Errorf("redact(%q) = %q (auth %v), want %q (auth %v)", tc.err, got, errors.Is(got, ErrAuthFailed), tc.want, tc.auth)
		}
	}
	if redact(nil, "x") != nil {
		t.Error("redact(nil) != nil")
	}
}

func TestNewerThan(t *testing.T) {
	tests := []struct {
		name     string
		uids     []uint32
		after    uint32
		limit    int
		want     []uint32
		wantLast uint32
	}{
		{"N:* returned only the last, older message", []uint32{5}, 7, 10, nil, 5},
		{"ascending after the checkpoint", []uint32{3, 4, 5}, 3, 0, []uint32{4, 5}, 5},
		{"reordered and repeated", []uint32{9, 4, 9, 6}, 0, 0, []uint32{4, 6, 9}, 9},
		{"limit keeps the oldest", []uint32{8, 6, 7}, 5, 2, []uint32{6, 7}, 8},
		{"empty", nil, 0, 5, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var metas []*imapclient.FetchMessageBuffer
			for _, u := range tc.uids {
				metas = append(metas, &imapclient.FetchMessageBuffer{UID: imap.UID(u)})
			}
			kept, last := newerThan(metas, tc.after, tc.limit)
			var got []uint32
			for _, m := range kept {
				got = append(got, uint32(m.UID))
			}
			if !slices.Equal(got, tc.want) || last != tc.wantLast {
				t.Fatalf("newerThan(%v, %d, %d) = %v, last %d; want %v, last %d", tc.uids, tc.after, tc.limit, got, last, tc.want, tc.wantLast)
			}
		})
	}
}
