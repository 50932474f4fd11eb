package source

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"

	"gpuhost/internal/loopback"
)

// ErrAuthFailed is returned (wrapped) when the server rejects the
// credentials, so the worker can tell "fix the password" from "the server
// is down".
var ErrAuthFailed = errors.New("IMAP login rejected")

// IMAPOptions configure an IMAP source (see config.TriageSourceConfig).
type IMAPOptions struct {
	// Addr is host:port.
	Addr string
	// Security is "tls" (implicit TLS, port 993), "starttls" or "plain".
	// Plain is refused for anything but a loopback address, because the
	// password would cross the network in clear text. Default "tls".
	Security string
	Username string
	// Password is called at each (re)connect, so a rotated secret is picked
	// up without a restart and the value is never kept in the options. It
	// never appears in a log line or an error.
	Password func() (string, error)
	// Mailbox defaults to INBOX.
	Mailbox string
	// InsecureSkipVerify accepts any certificate; only for a self-signed
	// server you trust.
	InsecureSkipVerify bool
	// Timeout bounds each network step (dial, TLS handshake, each command);
	// default 30s. A step that overruns drops the connection.
	Timeout time.Duration
	Log     *slog.Logger
}

// IMAP reads one mailbox over IMAP without changing it: the mailbox is
// opened read-only (EXAMINE) and bodies are fetched with BODY.PEEK, so the
// user's \Seen flags stay as they were. One connection is opened lazily
// and reopened on the next call after it drops; a call that finds the
// server unreachable returns the error (the worker counts them).
type IMAP struct {
	opts IMAPOptions
	name string
	log  *slog.Logger

	mu       sync.Mutex // one operation at a time on the connection
	c        *imapclient.Client
	canIdle  bool
	selected bool
	closed   bool

	// wantConn gets a token from a call waiting for mu, so that an IDLE
	// holding the connection ends early instead of making it wait up to d.
	wantConn chan struct{}
	// newMail gets a token when the server announces a grown mailbox
	// (unsolicited EXISTS), to end an IDLE wait early.
	newMail   chan struct{}
	closing   chan struct{}
	closeOnce sync.Once

	// onIdle, when set (tests), runs once the server has accepted IDLE.
	onIdle func()
}

// bodyChunkBytes bounds the bodies asked for in one FETCH, so one command's
// timeout covers a bounded transfer.
const bodyChunkBytes = 16 << 20

// NewIMAP returns an unconnected source; the first call connects.
func NewIMAP(opts IMAPOptions) *IMAP {
	if opts.Security == "" {
		opts.Security = "tls"
	}
	if opts.Mailbox == "" {
		opts.Mailbox = "INBOX"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	u := url.URL{Scheme: "imap", User: url.User(opts.Username), Host: opts.Addr, Path: "/" + opts.Mailbox}
	s := &IMAP{
		opts:     opts,
		name:     u.String(),
		newMail:  make(chan struct{}, 1),
		wantConn: make(chan struct{}, 1),
		closing:  make(chan struct{}),
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s.log = log.With("source", s.name)
	return s
}

// Name is "imap://user@host:port/INBOX".
func (s *IMAP) Name() string { return s.name }

// Fetch returns up to limit mails with UID > after, ascending; bodies of
// mails larger than maxBytes are replaced by their header (HeaderOnly).
// limit <= 0 means no limit, maxBytes <= 0 no size limit.
func (s *IMAP) Fetch(ctx context.Context, after uint32, limit int, maxBytes int64) (Batch, error) {
	s.lock()
	defer s.mu.Unlock()
	c, err := s.conn(ctx)
	if err != nil {
		return Batch{}, err
	}
	sel, err := s.examine(ctx, c)
	if err != nil {
		return Batch{}, err
	}
	b := Batch{UIDValidity: sel.UIDValidity}
	if sel.UIDNext > 0 {
		b.HighestUID = uint32(sel.UIDNext) - 1
	}
	if sel.NumMessages == 0 || after == math.MaxUint32 {
		return b, nil
	}
	if sel.UIDNext > 0 && after >= b.HighestUID {
		return b, nil // nothing new; skip the N:* round trip
	}

	// "UID FETCH N:*" always returns the last message, even when its UID is
	// below N (RFC 3501 6.4.8): filter.
	var set imap.UIDSet
	set.AddRange(imap.UID(after+1), 0)
	var metas []*imapclient.FetchMessageBuffer
	err = s.do(ctx, c, fmt.Sprintf("UID FETCH %d:* (UID RFC822.SIZE)", after+1), func() error {
		var err error
		metas, err = c.Fetch(set, &imap.FetchOptions{UID: true, RFC822Size: true}).Collect()
		return err
	})
	if err != nil {
		return Batch{}, err
	}
	metas, last := newerThan(metas, after, limit)
	b.HighestUID = max(b.HighestUID, last) // for a server without UIDNEXT
	b.Mails, err = s.bodies(ctx, c, metas, maxBytes)
	if err != nil {
		return Batch{}, err
	}
	return b, nil
}

// newerThan keeps the messages with UID > after (go-imap already drops the
// extra message "N:*" returns, but a server may also repeat or reorder),
// ascending and at most limit (<= 0: all). last is the highest UID seen.
func newerThan(metas []*imapclient.FetchMessageBuffer, after uint32, limit int) (kept []*imapclient.FetchMessageBuffer, last uint32) {
	for _, m := range metas {
		last = max(last, uint32(m.UID))
	}
	kept = slices.DeleteFunc(slices.Clone(metas), func(m *imapclient.FetchMessageBuffer) bool { return uint32(m.UID) <= after })
	slices.SortFunc(kept, func(a, b *imapclient.FetchMessageBuffer) int { return cmp.Compare(a.UID, b.UID) })
	kept = slices.CompactFunc(kept, func(a, b *imapclient.FetchMessageBuffer) bool { return a.UID == b.UID })
	if limit > 0 && len(kept) > limit {
		kept = kept[:limit]
	}
	return kept, last
}

// Get fetches one mail by UID; ErrNotFound when the mailbox lacks it.
func (s *IMAP) Get(ctx context.Context, uid uint32, maxBytes int64) (Mail, error) {
	if uid == 0 {
		return Mail{}, fmt.Errorf("%s: UID 0: %w", s.name, ErrNotFound)
	}
	s.lock()
	defer s.mu.Unlock()
	c, err := s.conn(ctx)
	if err != nil {
		return Mail{}, err
	}
	if _, err := s.examine(ctx, c); err != nil {
		return Mail{}, err
	}
	var metas []*imapclient.FetchMessageBuffer
	err = s.do(ctx, c, fmt.Sprintf("UID FETCH %d (UID RFC822.SIZE)", uid), func() error {
		var err error
		metas, err = c.Fetch(imap.UIDSetNum(imap.UID(uid)), &imap.FetchOptions{UID: true, RFC822Size: true}).Collect()
		return err
	})
	if err != nil {
		return Mail{}, err
	}
	metas = slices.DeleteFunc(metas, func(m *imapclient.FetchMessageBuffer) bool { return uint32(m.UID) != uid })
	if len(metas) == 0 {
		return Mail{}, fmt.Errorf("%s: UID %d: %w", s.name, uid, ErrNotFound)
	}
	mails, err := s.bodies(ctx, c, metas[:1], maxBytes)
	if err != nil {
		return Mail{}, err
	}
	if len(mails) == 0 {
		return Mail{}, fmt.Errorf("%s: UID %d (expunged while fetching): %w", s.name, uid, ErrNotFound)
	}
	return mails[0], nil
}

// Wait returns after d, when the server announces new mail (IMAP IDLE, if
// it has the capability and a mailbox is open), when the connection drops
// (so the next Fetch reconnects and reports), or when ctx ends (ctx.Err()).
// Without IDLE it sleeps.
func (s *IMAP) Wait(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	sleep := func() error {
		select {
		case <-timer.C:
			return nil
		case <-s.closing:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	s.mu.Lock()
	c := s.c
	if c == nil || !s.canIdle || !s.selected || isClosed(c) {
		s.mu.Unlock() // a Get (manual mode) must not wait behind a sleep
		return sleep()
	}
	defer s.mu.Unlock()
	var idle *imapclient.IdleCommand
	err := s.do(ctx, c, "IDLE", func() error {
		var err error
		idle, err = c.Idle()
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Debug("IDLE failed; sleeping instead", "err", err)
		return sleep()
	}
	if s.onIdle != nil {
		s.onIdle()
	}
	var werr error
	select {
	case <-s.newMail:
		s.log.Debug("IDLE: new mail")
	case <-timer.C:
	case <-s.closing:
	case <-s.wantConn:
		s.log.Debug("IDLE ended early: another call needs the connection")
	case <-c.Closed():
		s.log.Info("IMAP connection dropped while idle; the next poll reconnects")
	case <-ctx.Done():
		werr = ctx.Err()
	}
	err = s.do(context.Background(), c, "DONE (end IDLE)", func() error {
		if err := idle.Close(); err != nil {
			return err
		}
		return idle.Wait()
	})
	if err != nil {
		s.log.Debug("ending IDLE failed; the next poll reconnects", "err", err)
		s.dropLocked()
	}
	return werr
}

// Close ends a running Wait, logs out (best effort, at most 5 s, so a
// hung server cannot hold up a shutdown) and closes the connection; later
// calls fail with net.ErrClosed.
func (s *IMAP) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if c := s.c; c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.do(ctx, c, "LOGOUT", func() error { return c.Logout().Wait() })
		s.dropLocked()
	}
	return nil
}

// lock takes the connection for one call, interrupting an IDLE in Wait.
func (s *IMAP) lock() {
	select {
	case s.wantConn <- struct{}{}:
	default:
	}
	s.mu.Lock()
	select {
	case <-s.wantConn:
	default:
	}
}

// conn returns the open connection or opens one: lazily at the first call
// and again after a drop.
func (s *IMAP) conn(ctx context.Context) (*imapclient.Client, error) {
	if s.closed {
		return nil, fmt.Errorf("%s: %w", s.name, net.ErrClosed)
	}
	if s.c != nil && !isClosed(s.c) {
		return s.c, nil
	}
	if s.c != nil {
		s.log.Info("IMAP connection was dropped; reconnecting")
		s.dropLocked()
	}
	c, canIdle, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	s.c, s.canIdle, s.selected = c, canIdle, false
	s.log.Info("IMAP connected", "addr", s.opts.Addr, "security", s.opts.Security, "idle", canIdle)
	return c, nil
}

// dial connects, secures and logs in.
func (s *IMAP) dial(ctx context.Context) (*imapclient.Client, bool, error) {
	host, password, err := s.dialSettings()
	if err != nil {
		return nil, false, err
	}
	c, err := s.connect(ctx, host)
	if err != nil {
		return nil, false, err
	}
	canIdle, err := s.login(ctx, c, password)
	if err != nil {
		c.Close()
		return nil, false, redact(err, password)
	}
	return c, canIdle, nil
}

// dialSettings checks the address and the security setting (plain only
// to a loopback address) and reads the password, before any connection.
func (s *IMAP) dialSettings() (host, password string, err error) {
	host, _, err = net.SplitHostPort(s.opts.Addr)
	if err != nil {
		return "", "", fmt.Errorf("%s: address %q is not host:port: %w", s.name, s.opts.Addr, err)
	}
	switch s.opts.Security {
	case "tls", "starttls":
	case "plain":
		if !loopback.DialsLoopback(host) {
			return "", "", fmt.Errorf("%s: security plain (no TLS) is allowed only to a loopback address, not %q", s.name, host)
		}
	default:
		return "", "", fmt.Errorf("%s: security %q is not tls, starttls or plain", s.name, s.opts.Security)
	}
	if s.opts.Password == nil {
		return "", "", fmt.Errorf("%s: no password source configured", s.name)
	}
	password, err = s.opts.Password()
	if err != nil {
		return "", "", fmt.Errorf("%s: read password: %w", s.name, err)
	}
	if password == "" {
		return "", "", fmt.Errorf("%s: the password is empty", s.name)
	}
	return host, password, nil
}

// connect opens the TCP connection and secures it as opts.Security says
// (TLS from the start, STARTTLS, or none), with a client that signals
// s.newMail when the server announces a new message count.
func (s *IMAP) connect(ctx context.Context, host string) (*imapclient.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", s.opts.Addr)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", s.name, err)
	}
	tlsConfig := &tls.Config{
		ServerName:         host,
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: s.opts.InsecureSkipVerify, //nolint:gosec // opt-in for a self-signed server
	}
	options := &imapclient.Options{
		TLSConfig: tlsConfig,
		UnilateralDataHandler: &imapclient.UnilateralDataHandler{
			Mailbox: func(data *imapclient.UnilateralDataMailbox) {
				if data.NumMessages != nil {
					select {
					case s.newMail <- struct{}{}:
					default:
					}
				}
			},
		},
	}

	var c *imapclient.Client
	switch s.opts.Security {
	case "tls":
		tconn := tls.Client(conn, tlsConfig)
		hctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		err := tconn.HandshakeContext(hctx)
		cancel()
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("%s: TLS handshake: %w", s.name, err)
		}
		c = imapclient.New(tconn, options)
	case "starttls":
		err := s.bounded(ctx, "STARTTLS", func() { conn.Close() }, func() error {
			var err error
			c, err = imapclient.NewStartTLS(conn, options)
			return err
		})
		if err != nil {
			conn.Close()
			return nil, err
		}
	default:
		c = imapclient.New(conn, options)
	}
	return c, nil
}

// login waits for the greeting, logs in (a refusal is ErrAuthFailed) and
// reads the capabilities: canIdle says the server has IDLE. The error
// may hold the password; dial redacts it.
func (s *IMAP) login(ctx context.Context, c *imapclient.Client, password string) (canIdle bool, err error) {
	err = s.do(ctx, c, "greeting", c.WaitGreeting)
	if err == nil {
		err = s.do(ctx, c, "LOGIN as "+s.opts.Username, func() error {
			err := c.Login(s.opts.Username, password).Wait()
			var ierr *imap.Error
			if errors.As(err, &ierr) && (ierr.Code == imap.ResponseCodeAuthenticationFailed ||
				ierr.Type == imap.StatusResponseTypeNo && ierr.Code == "") {
				return fmt.Errorf("%w: %w", ErrAuthFailed, err)
			}
			return err
		})
	}
	if err == nil {
		err = s.do(ctx, c, "CAPABILITY", func() error {
			caps := c.Caps()
			if caps == nil {
				return errors.New("no capability list")
			}
			canIdle = caps.Has(imap.CapIdle) || caps.Has(imap.CapIMAP4rev2)
			return nil
		})
	}
	return canIdle, err
}

// examine opens the mailbox read-only, for fresh UIDVALIDITY/UIDNEXT on
// every poll.
func (s *IMAP) examine(ctx context.Context, c *imapclient.Client) (*imap.SelectData, error) {
	// The answer to EXAMINE covers whatever was announced before it.
	select {
	case <-s.newMail:
	default:
	}
	var sel *imap.SelectData
	err := s.do(ctx, c, "EXAMINE "+s.opts.Mailbox, func() error {
		var err error
		sel, err = c.Select(s.opts.Mailbox, &imap.SelectOptions{ReadOnly: true}).Wait()
		return err
	})
	if err != nil {
		s.selected = false
		return nil, err
	}
	s.selected = true
	if sel.UIDValidity == 0 {
		return nil, fmt.Errorf("%s: EXAMINE %s: the server sent no UIDVALIDITY", s.name, s.opts.Mailbox)
	}
	return sel, nil
}

// bodies fetches the listed mails: whole (BODY.PEEK[]) up to maxBytes,
// header only (BODY.PEEK[HEADER]) above. A mail the server no longer
// returns (expunged meanwhile) is left out.
func (s *IMAP) bodies(ctx context.Context, c *imapclient.Client, metas []*imapclient.FetchMessageBuffer, maxBytes int64) ([]Mail, error) {
	whole := &imap.FetchItemBodySection{Peek: true}
	header := &imap.FetchItemBodySection{Specifier: imap.PartSpecifierHeader, Peek: true}
	got := make(map[imap.UID][]byte, len(metas))
	fetch := func(uids []imap.UID, section *imap.FetchItemBodySection, what string) error {
		if len(uids) == 0 {
			return nil
		}
		set := imap.UIDSetNum(uids...)
		return s.do(ctx, c, fmt.Sprintf("UID FETCH %s (UID %s)", set, what), func() error {
			return readBodies(c, c.Fetch(set, &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{section}}), section, got)
		})
	}

	var large, chunk []imap.UID
	var chunkBytes int64
	for _, m := range metas {
		if maxBytes > 0 && m.RFC822Size > maxBytes {
			large = append(large, m.UID)
			continue
		}
		if len(chunk) > 0 && chunkBytes+m.RFC822Size > bodyChunkBytes {
			if err := fetch(chunk, whole, "BODY.PEEK[]"); err != nil {
				return nil, err
			}
			chunk, chunkBytes = nil, 0
		}
		chunk = append(chunk, m.UID)
		chunkBytes += m.RFC822Size
	}
	if err := fetch(chunk, whole, "BODY.PEEK[]"); err != nil {
		return nil, err
	}
	if err := fetch(large, header, "BODY.PEEK[HEADER]"); err != nil {
		return nil, err
	}

	mails := make([]Mail, 0, len(metas))
	for _, m := range metas {
		raw, ok := got[m.UID]
		if !ok {
			s.log.Warn("mail vanished between listing and fetching", "uid", m.UID)
			continue
		}
		mails = append(mails, Mail{
			UID:        uint32(m.UID),
			Size:       m.RFC822Size,
			Raw:        raw,
			HeaderOnly: maxBytes > 0 && m.RFC822Size > maxBytes,
		})
	}
	return mails, nil
}

// readBodies reads the answer to a FETCH of body sections into got (UID →
// the section's bytes). It stands in for go-imap's Collect, which, when the
// connection ends inside a literal, takes the truncated literal for the
// whole one and then reads the rest of it again while the client's reader
// goroutine reads the same buffer (go-imap v2.0.0-beta.8: a data race, and
// a short body that only the command's final error keeps from being used).
// Here every literal must arrive in full; one that does not is an error,
// and the command is then abandoned and the connection closed without
// touching either again.
func readBodies(c *imapclient.Client, cmd *imapclient.FetchCommand, section *imap.FetchItemBodySection, got map[imap.UID][]byte) error {
	for msg := cmd.Next(); msg != nil; msg = cmd.Next() {
		var (
			uid  imap.UID
			body []byte
		)
		for item := msg.Next(); item != nil; item = msg.Next() {
			switch item := item.(type) {
			case imapclient.FetchItemDataUID:
				uid = item.UID
			case imapclient.FetchItemDataBodySection:
				if item.Literal == nil {
					continue // NIL: the server has no such section
				}
				b, err := readLiteral(item.Literal)
				if err != nil {
					c.Close()
					return fmt.Errorf("read the body of message %d (UID %d): %w", msg.SeqNum, uid, err)
				}
				if item.MatchCommand(section) {
					body = b
				}
			}
		}
		if uid != 0 && body != nil {
			got[uid] = body
		}
	}
	return cmd.Close()
}

// readLiteral reads a literal whole; one that ends before the size the
// server announced is io.ErrUnexpectedEOF (the connection dropped inside it).
func readLiteral(lit imap.LiteralReader) ([]byte, error) {
	b, err := io.ReadAll(lit)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != lit.Size() {
		return nil, fmt.Errorf("the connection ended after %d of the %d bytes announced: %w", len(b), lit.Size(), io.ErrUnexpectedEOF)
	}
	return b, nil
}

// do runs one command exchange on c under the per-command timeout and ctx.
// When either runs out, the connection is closed (which ends the exchange)
// and dropped. Errors other than a server's NO/BAD also drop it: the
// connection is then unusable and the next call reconnects.
func (s *IMAP) do(ctx context.Context, c *imapclient.Client, what string, fn func() error) error {
	err := s.bounded(ctx, what, func() { c.Close() }, fn)
	var ierr *imap.Error
	if err != nil && !errors.As(err, &ierr) && s.c == c {
		s.dropLocked()
	}
	return err
}

// bounded runs fn, calling abort (which must make fn return) when the
// timeout or ctx runs out first. The error names the step and the server.
func (s *IMAP) bounded(ctx context.Context, what string, abort func(), fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	timer := time.NewTimer(s.opts.Timeout)
	defer timer.Stop()
	var err error
	select {
	case err = <-done:
		if err != nil {
			err = fmt.Errorf("%s: %s: %w", s.name, what, err)
		}
		return err
	case <-timer.C:
		err = fmt.Errorf("%s: %s: no answer within %s", s.name, what, s.opts.Timeout)
	case <-ctx.Done():
		err = fmt.Errorf("%s: %s: %w", s.name, what, ctx.Err())
	}
	abort()
	select {
	case <-done:
	case <-time.After(5 * time.Second): // fn is stuck beyond a closed socket; let it go
	}
	return err
}

// dropLocked forgets the connection (closing it); s.mu must be held.
func (s *IMAP) dropLocked() {
	if s.c != nil {
		s.c.Close()
	}
	s.c, s.selected, s.canIdle = nil, false, false
}

func isClosed(c *imapclient.Client) bool {
	select {
	case <-c.Closed():
		return true
	default:
		return false
	}
}

// redact keeps the password out of an error text, in case a server or a
// library ever echoes it.
func redact(err error, password string) error {
	if err == nil || password == "" || !strings.Contains(err.Error(), password) {
		return err
	}
	return &redactedError{msg: strings.ReplaceAll(err.Error(), password, "[redacted]"), auth: errors.Is(err, ErrAuthFailed)}
}

// redactedError deliberately does not unwrap: the wrapped text held the
// password.
type redactedError struct {
	msg  string
	auth bool
}

func (e *redactedError) Error() string { return e.msg }

func (e *redactedError) Is(target error) bool { return e.auth && target == ErrAuthFailed }
