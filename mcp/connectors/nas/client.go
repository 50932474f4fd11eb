package nas

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// maxBody caps a DSM answer; the lists this connector asks for are small.
const maxBody = 4 << 20

// Session error codes after which the client logs in again and retries
// once (DSM Web API common error codes).
const (
	codeSessionTimeout     = 106
	codeSessionInterrupted = 107
	codeSIDNotFound        = 119
)

func isSessionError(code int) bool {
	return code == codeSessionTimeout || code == codeSessionInterrupted || code == codeSIDNotFound
}

// commonErrors are the DSM Web API's common error codes.
var commonErrors = map[int]string{
	100: "unknown error",
	101: "no API, method or version parameter",
	102: "the requested API does not exist (is the package installed and DSM recent enough?)",
	103: "the requested method does not exist",
	104: "the requested version does not support this functionality",
	105: "the account has no permission for this API (some APIs need an administrator account)",
	106: "session timed out",
	107: "session interrupted by a duplicate login",
	108: "failed to upload the file",
	109: "the network connection is unstable or the system is busy",
	110: "the network connection is unstable or the system is busy",
	111: "the network connection is unstable or the system is busy",
	117: "the network connection is unstable or the system is busy",
	118: "the network connection is unstable or the system is busy",
	119: "session id not found",
	120: "invalid parameter",
}

// authErrors are SYNO.API.Auth's login error codes.
var authErrors = map[int]string{
	400: "no such account or incorrect password",
	401: "the account is disabled",
	402: "permission denied",
	403: "2-step verification code required; use an account without 2-step verification",
	404: "2-step verification code rejected",
	406: "2-step verification is enforced for this account; use another account",
	407: "this host's IP address is blocked by DSM's auto-block",
	408: "the password has expired and cannot be changed",
	409: "the password has expired",
	410: "the password must be changed before use",
}

// DSMError is a DSM answer with success false.
type DSMError struct {
	Code int
	// Login is true for a SYNO.API.Auth login failure (different code table).
	Login bool
}

func (e *DSMError) Error() string {
	table := commonErrors
	if e.Login {
		if msg, ok := authErrors[e.Code]; ok {
			return fmt.Sprintf("%s (DSM error %d)", msg, e.Code)
		}
	}
	if msg, ok := table[e.Code]; ok {
		return fmt.Sprintf("%s (DSM error %d)", msg, e.Code)
	}
	return fmt.Sprintf("DSM error %d", e.Code)
}

// client talks to one DSM. It holds one session id shared by all calls;
// logins are serialised so concurrent calls that find no (or a stale)
// session trigger one login between them.
type client struct {
	name    string
	base    string
	user    string
	passEnv string
	http    *http.Client
	timeout time.Duration
	secrets *connector.Secrets
	log     *slog.Logger

	loginSem chan struct{} // capacity 1: one login at a time, ctx-aware waiting

	mu  sync.Mutex
	sid string
	gen uint64 // bumped on every login, so a caller can tell its sid is stale
}

func newClient(n NAS, base *http.Client, timeout time.Duration, secrets *connector.Secrets, log *slog.Logger) *client {
	hc := base
	if n.InsecureTLS {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if b, ok := base.Transport.(*http.Transport); ok {
			t = b.Clone()
		}
		if t.TLSClientConfig == nil {
			t.TLSClientConfig = &tls.Config{}
		}
		// Opt-in per NAS for DSM's self-signed certificate; the traffic is
		// still encrypted, only the certificate chain is not checked.
		t.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // configured explicitly by the operator
		hc = &http.Client{Transport: t, Timeout: base.Timeout, CheckRedirect: base.CheckRedirect, Jar: base.Jar}
	}
	return &client{
		name: n.Name, base: strings.TrimRight(n.URL, "/"), user: n.User, passEnv: n.PasswordEnv,
		http: hc, timeout: timeout, secrets: secrets, log: log.With("nas", n.Name),
		loginSem: make(chan struct{}, 1),
	}
}

// session returns a usable sid. stale is the generation of a sid the
// caller found rejected (0 when it has none): if someone else already
// replaced it, that newer session is returned without another login.
func (c *client) session(ctx context.Context, stale uint64) (string, uint64, error) {
	select {
	case c.loginSem <- struct{}{}:
	case <-ctx.Done():
		return "", 0, fmt.Errorf("NAS '%s': waiting for login: %w", c.name, ctx.Err())
	}
	defer func() { <-c.loginSem }()
	c.mu.Lock()
	sid, gen := c.sid, c.gen
	c.mu.Unlock()
	if sid != "" && gen != stale {
		return sid, gen, nil
	}
	sid, err := c.login(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.sid = ""
		return "", c.gen, err
	}
	c.gen++
	c.sid = sid
	return sid, c.gen, nil
}

func (c *client) current(ctx context.Context) (string, uint64, error) {
	c.mu.Lock()
	sid, gen := c.sid, c.gen
	c.mu.Unlock()
	if sid != "" {
		return sid, gen, nil
	}
	return c.session(ctx, gen)
}

func (c *client) login(ctx context.Context) (string, error) {
	if c.secrets == nil {
		return "", &connector.MissingSecretError{Name: c.passEnv}
	}
	pass, err := c.secrets.Get(c.passEnv)
	if err != nil {
		return "", err
	}
	form := url.Values{
		"api": {"SYNO.API.Auth"}, "version": {"6"}, "method": {"login"},
		"account": {c.user}, "passwd": {pass}, "session": {"gpuhost"}, "format": {"sid"},
	}
	data, err := c.post(ctx, form, pass)
	if err != nil {
		var de *DSMError
		if errors.As(err, &de) {
			de.Login = true
			return "", fmt.Errorf("NAS '%s': login as %q failed: %w; check the account and the password in %s", c.name, c.user, de, c.passEnv)
		}
		return "", fmt.Errorf("NAS '%s': login: %w", c.name, err)
	}
	var d struct {
		SID string `json:"sid"`
	}
	if err := json.Unmarshal(data, &d); err != nil || d.SID == "" {
		return "", fmt.Errorf("NAS '%s': login answer has no sid (is format=sid supported by this DSM?)", c.name)
	}
	c.log.Info("logged in to DSM", "user", c.user)
	return d.SID, nil
}

// call runs one API method with the shared session, logging in again and
// retrying once on a session error.
func (c *client) call(ctx context.Context, api string, version int, method string, extra url.Values) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	sid, gen, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		form := url.Values{"api": {api}, "version": {fmt.Sprint(version)}, "method": {method}, "_sid": {sid}}
		for k, v := range extra {
			form[k] = v
		}
		data, err := c.post(ctx, form, sid)
		var de *DSMError
		if errors.As(err, &de) && isSessionError(de.Code) && attempt == 0 {
			c.log.Info("DSM session no longer valid; logging in again", "code", de.Code, "api", api)
			if sid, gen, err = c.session(ctx, gen); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("NAS '%s': %s %s: %w", c.name, api, method, err)
		}
		return data, nil
	}
}

// post sends form to entry.cgi and returns the data of a successful
// answer. hide is a value (password or sid) scrubbed from any body excerpt.
func (c *client) post(ctx context.Context, form url.Values, hide string) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/webapi/entry.cgi", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			if ue.Timeout() {
				return nil, fmt.Errorf("no answer within %s (NAS offline or overloaded?)", c.timeout)
			}
			err = ue.Err // without the URL
		}
		return nil, fmt.Errorf("unreachable: %s", c.redact(err.Error(), hide))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, c.excerpt(body, hide))
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/html" || !looksJSON(body) {
		return nil, fmt.Errorf("answer is not JSON (is the URL a DSM web API?): %s", c.excerpt(body, hide))
	}
	return ParseResponse(body)
}

// redact removes hide and every secret handed out so far from s.
func (c *client) redact(s, hide string) string {
	vals := []string{hide}
	if c.secrets != nil {
		vals = append(vals, c.secrets.Values()...)
	}
	for _, v := range vals {
		if v == "" {
			continue
		}
		s = strings.ReplaceAll(s, v, "[redacted]")
		if enc := url.QueryEscape(v); enc != v {
			s = strings.ReplaceAll(s, enc, "[redacted]")
		}
	}
	return s
}

// excerpt is a short, secret-free excerpt of body: redacted first, then
// cut, so a truncation can never leave part of a secret behind.
func (c *client) excerpt(body []byte, hide string) string {
	s := []rune(c.redact(snippet(body), hide))
	if len(s) > 200 {
		return string(s[:200]) + "…"
	}
	return string(s)
}

func looksJSON(b []byte) bool {
	return strings.HasPrefix(strings.TrimSpace(string(b[:min(len(b), 64)])), "{")
}

// snippet is a short single-line excerpt for an error; callers redact the
// full text before this truncates, never after.
func snippet(body []byte) string {
	s := strings.Join(strings.Fields(string(body)), " ")
	if s == "" {
		return "(empty body)"
	}
	return s
}
