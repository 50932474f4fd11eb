package panel

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/frontdoor"
	"gpuhost/internal/loopback"
)

// Cookie names. Both are HttpOnly and SameSite=Strict; neither is readable
// by script, and a cross-site request never carries them.
const (
	sessionCookie = "gpuhost_session"
	csrfCookie    = "gpuhost_csrf"
	csrfField     = "csrf"
	csrfHeader    = "X-CSRF-Token"
	keyFreshNonce = "panel.csrf.fresh"
)

func randomBytes(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("read %d random bytes: %w", n, err)
	}
	return b, nil
}

func randomToken() (string, error) {
	b, err := randomBytes(32)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// validToken reports whether s looks like a randomToken (43 base64url
// characters), so malformed cookies are dropped before any lookup.
func validToken(s string) bool {
	if len(s) != 43 {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// session is one login. The store keys sessions by the SHA-256 of their id,
// so neither a memory dump nor lookup timing gives a usable cookie, and
// remembers the hash of the token used to log in: rotating the API token
// ends every browser session.
type session struct {
	expires   time.Time
	created   time.Time
	tokenHash [32]byte
}

type sessionStore struct {
	ttl time.Duration
	max int

	mu   sync.Mutex
	byID map[[32]byte]session
}

func newSessionStore(ttl time.Duration, max int) *sessionStore {
	return &sessionStore{ttl: ttl, max: max, byID: map[[32]byte]session{}}
}

// create makes a session and returns its raw id (the cookie value).
func (s *sessionStore) create(now time.Time, tokenHash [32]byte) (string, error) {
	id, err := randomToken()
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
	for len(s.byID) >= s.max {
		var oldestKey [32]byte
		var oldest time.Time
		first := true
		for k, v := range s.byID {
			if first || v.created.Before(oldest) {
				oldestKey, oldest, first = k, v.created, false
			}
		}
		delete(s.byID, oldestKey)
	}
	s.byID[sha256.Sum256([]byte(id))] = session{expires: now.Add(s.ttl), created: now, tokenHash: tokenHash}
	return id, nil
}

// valid reports whether id is a live session created with the token whose
// hash is tokenHash.
func (s *sessionStore) valid(id string, now time.Time, tokenHash [32]byte) bool {
	if !validToken(id) {
		return false
	}
	key := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.byID[key]
	if !ok {
		return false
	}
	if !now.Before(sess.expires) || subtle.ConstantTimeCompare(sess.tokenHash[:], tokenHash[:]) != 1 {
		delete(s.byID, key)
		return false
	}
	return true
}

func (s *sessionStore) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, sha256.Sum256([]byte(id)))
}

func (s *sessionStore) sweepLocked(now time.Time) {
	for k, v := range s.byID {
		if !now.Before(v.expires) {
			delete(s.byID, k)
		}
	}
}

func (s *sessionStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// currentTokenHash reads the API token now (it may have been rotated).
func (p *Panel) currentTokenHash() ([32]byte, bool) {
	tok, err := p.daemon.APIToken()
	if err != nil || tok == "" {
		return [32]byte{}, false
	}
	return sha256.Sum256([]byte(tok)), true
}

// sessionFrom returns the request's session id when it is valid, else "".
func (p *Panel) sessionFrom(c echo.Context) string {
	ck, err := c.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	th, ok := p.currentTokenHash()
	if !ok {
		return ""
	}
	if !p.sessions.valid(ck.Value, p.now(), th) {
		return ""
	}
	return ck.Value
}

// secureRequest decides the cookies' Secure flag: set whenever the request
// came over TLS, and whenever the peer is beyond loopback (the token and the
// session must not travel in clear over a network; a browser on plain http
// from another machine keeps no session, so the panel beyond loopback needs
// https in front of it). X-Forwarded-Proto is trusted only from a loopback
// peer, i.e. a TLS-terminating proxy on this machine; from any other peer
// it changes nothing, since the flag is set anyway.
func secureRequest(c echo.Context) bool {
	r := c.Request()
	if r.TLS != nil || !loopback.IsHost(stripPort(r.RemoteAddr)) {
		return true
	}
	return strings.EqualFold(strings.TrimSpace(r.Header.Get(echo.HeaderXForwardedProto)), "https")
}

func (p *Panel) setCookie(c echo.Context, name, value string, maxAge int) {
	c.SetCookie(&http.Cookie{
		Name: name, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secureRequest(c),
	})
}

// csrfNonce returns the browser's CSRF nonce, setting a fresh cookie when
// it has none (or a malformed one).
func (p *Panel) csrfNonce(c echo.Context) (string, error) {
	if ck, err := c.Cookie(csrfCookie); err == nil && validToken(ck.Value) {
		return ck.Value, nil
	}
	n, err := randomToken()
	if err != nil {
		return "", err
	}
	p.setCookie(c, csrfCookie, n, 0)
	// A POST without the cookie fails the CSRF check; the next page it
	// loads has the cookie.
	c.Set(keyFreshNonce, true)
	return n, nil
}

// csrfToken binds a token to the browser (nonce cookie) and the session, so
// a token seen in one session is useless in another, and nobody without the
// server's key can mint one for a cookie they planted.
func (p *Panel) csrfToken(nonce, sid string) string {
	m := hmac.New(sha256.New, p.csrfKey)
	m.Write([]byte("gpuhost-panel-csrf\x00"))
	m.Write([]byte(nonce))
	m.Write([]byte{0})
	m.Write([]byte(sid))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// errCSRF* are the reasons a POST is refused; the message reaches the
// operator, so each says what to do.
var (
	errCrossSite   = errors.New("cross-site request refused (Sec-Fetch-Site is not same-origin)")
	errOrigin      = errors.New("request from another origin refused")
	errNoCSRFToken = errors.New("missing CSRF token: reload the page and try again")
	errBadCSRF     = errors.New("invalid CSRF token (the page is stale or the session changed): reload the page and try again")
)

// checkCSRF verifies that a POST comes from the panel's own pages: the
// browser's fetch metadata and Origin (when sent) name our origin, and the
// form field or header carries the token bound to this browser and session.
func (p *Panel) checkCSRF(c echo.Context, nonce, sid string) error {
	req := c.Request()
	if err := sameOrigin(req.Header.Get("Sec-Fetch-Site"), req.Header.Get("Origin"), c.Scheme(), req.Host); err != nil {
		return err
	}
	if fresh, _ := c.Get(keyFreshNonce).(bool); fresh {
		// The browser had no nonce cookie, so it cannot hold a valid token.
		return errNoCSRFToken
	}
	got := req.Header.Get(csrfHeader)
	if got == "" {
		got = c.FormValue(csrfField)
	}
	if got == "" {
		return errNoCSRFToken
	}
	want := p.csrfToken(nonce, sid)
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return errBadCSRF
	}
	return nil
}

// sameOrigin checks the browser-supplied provenance headers of a POST.
// Absent headers pass (old browsers, curl with a token); present ones must
// name this origin exactly.
func sameOrigin(fetchSite, origin, scheme, host string) error {
	if fetchSite != "" && fetchSite != "same-origin" {
		return fmt.Errorf("%w (it is %q)", errCrossSite, fetchSite)
	}
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("%w: Origin %q is not an origin", errOrigin, origin)
	}
	if !strings.EqualFold(u.Scheme, scheme) || !strings.EqualFold(u.Host, host) {
		return fmt.Errorf("%w: Origin %q is not %s://%s", errOrigin, origin, scheme, host)
	}
	return nil
}

// safeNext returns next when it is a local path of this site (so the login
// form cannot be turned into an open redirect), else "/".
func safeNext(next string) string {
	if next == "" || len(next) > 2048 || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	for _, r := range next {
		if r == '\\' || r < 0x20 || r == 0x7f {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	if u.Path == "/login" || u.Path == "/logout" {
		return "/"
	}
	return next
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// loginView is the body of the login page.
type loginView struct {
	Next  string
	Error string
}

func (p *Panel) handleLoginPage(c echo.Context) error {
	next := safeNext(c.QueryParam("next"))
	if sid, _ := c.Get(keySession).(string); !p.authRequired || sid != "" || p.sessionFrom(c) != "" {
		return c.Redirect(http.StatusSeeOther, next)
	}
	return p.render(c, http.StatusOK, "login", p.pageData(c, "login", "Log in", loginView{Next: next}))
}

// handleLogin checks the API token in constant time and starts a session.
func (p *Panel) handleLogin(c echo.Context) error {
	next := safeNext(c.FormValue("next"))
	if !p.authRequired {
		return c.Redirect(http.StatusSeeOther, next)
	}
	want, err := p.daemon.APIToken()
	if err != nil || want == "" {
		p.log.Error("login impossible: API token unreadable", "err", err)
		return p.render(c, http.StatusServiceUnavailable, "login", p.pageData(c, "login", "Log in",
			loginView{Next: next, Error: "The API token is not readable on the server; see the daemon log."}))
	}
	// The token is checked first: the right one logs in also from a
	// throttled address (see frontdoor.Throttle).
	got := c.FormValue("token")
	gh, wh := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	if subtle.ConstantTimeCompare(gh[:], wh[:]) != 1 {
		c.Response().Header().Set("Connection", "close")
		wait, blocked := p.logins.Blocked(c.Request().RemoteAddr)
		p.logins.Fail(c.Request().RemoteAddr)
		if blocked {
			c.Response().Header().Set("Retry-After", frontdoor.RetryAfterSeconds(wait))
			return p.render(c, http.StatusTooManyRequests, "login", p.pageData(c, "login", "Log in",
				loginView{Next: next, Error: "Too many wrong tokens from this address; try again in " + frontdoor.RetryAfterSeconds(wait) + " s."}))
		}
		return p.render(c, http.StatusUnauthorized, "login", p.pageData(c, "login", "Log in",
			loginView{Next: next, Error: "Wrong token."}))
	}
	if old, err := c.Cookie(sessionCookie); err == nil {
		p.sessions.remove(old.Value) // a login never reuses a planted id
	}
	id, err := p.sessions.create(p.now(), wh)
	if err != nil {
		return p.renderError(c, http.StatusInternalServerError, "Internal error", "cannot create a session: "+err.Error())
	}
	p.setCookie(c, sessionCookie, id, int(SessionTTL/time.Second))
	p.log.Info("panel login", "remote", c.RealIP())
	return c.Redirect(http.StatusSeeOther, next)
}

// handleLogout ends the session and forgets the cookie.
func (p *Panel) handleLogout(c echo.Context) error {
	if sid, _ := c.Get(keySession).(string); sid != "" {
		p.sessions.remove(sid)
	}
	p.setCookie(c, sessionCookie, "", -1)
	if !p.authRequired {
		return c.Redirect(http.StatusSeeOther, "/")
	}
	return c.Redirect(http.StatusSeeOther, "/login")
}

// stripPort drops the port of a Host header value.
func stripPort(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}
