// Package frontdoor is the one guard in front of every route of the daemon's
// HTTP listener (API, /v1, /mcp, /metrics, /api/events, the panel). It
// decides, before routing, whether a request may be attributed to someone
// the daemon answers:
//
//   - Host: the name the client used must be one the daemon answers to
//     (loopback names and addresses, the listen host, the configured
//     allowed_hosts; beyond loopback also any IP literal). A page that
//     rebinds its own DNS name to 127.0.0.1 sends its own name as Host and
//     gets 421, so it can neither read nor write through the browser.
//   - Provenance of state-changing requests and preflights (every method
//     but GET and HEAD): a browser's Sec-Fetch-Site of cross-site or same-site, or an
//     Origin that is not the daemon's own, is refused with 403. Clients that
//     are not browsers (opencode, curl, SDKs) send neither header.
//   - Content type: state-changing requests must say application/json. A
//     web page can send text/plain, form and multipart bodies without a
//     CORS preflight, but not JSON, so this rule alone stops "simple"
//     cross-site requests even from browsers that send no fetch metadata.
//     The panel's own form posts (which carry its CSRF token) are exempt by
//     path.
//   - Body size on /api and /mcp, and what decoding a body there may
//     allocate: JSON depth and values are checked before any handler
//     decodes it, and the bodies being read and decoded at once share one
//     memory budget (internal/jsonlimit, internal/membudget).
//   - A read deadline for request bodies and a per-write deadline for
//     answers: a stream may run for as long as its client reads it.
//   - Event streams (SSE) per client and in total, so that streams cannot
//     hold every connection slot. Every loopback address is one client
//     (ClientKey); LimitPerClient caps each client's connections.
//
// Failed authentication (bearer tokens, panel logins) is throttled per
// client by Throttle.
package frontdoor

import (
	"fmt"
	"math"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/apishape"
	"gpuhost/internal/jsonlimit"
	"gpuhost/internal/loopback"
	"gpuhost/internal/membudget"
)

// Options configure Guard. Zero sizes and durations disable that limit.
type Options struct {
	// Listen is the daemon's listen address (host:port).
	Listen string
	// AllowedHosts are further names (or addresses) clients may use in the
	// Host header, such as "gpu-box.lan".
	AllowedHosts []string
	// FormPaths are the routes whose POSTs are browser forms protected by
	// the panel's CSRF token; they may use form content types.
	FormPaths []string
	// MultipartPrefixes are the paths whose POSTs may be multipart uploads
	// (OpenAI's audio transcription API takes multipart/form-data).
	MultipartPrefixes []string
	// MaxBodyBytes bounds request bodies on paths under LimitedPrefixes.
	MaxBodyBytes int64
	// LimitedPrefixes are the path prefixes MaxBodyBytes applies to (the
	// /v1 proxy has its own limit and memory budget).
	LimitedPrefixes []string
	// BodyReadTimeout bounds the time to receive a request body.
	BodyReadTimeout time.Duration
	// WriteTimeout bounds each write of an answer (see withWriteDeadline).
	WriteTimeout time.Duration
	// StreamPaths are the GET routes that answer with a long-lived event
	// stream; each client may hold MaxStreamsPerClient of them, all
	// clients together MaxStreams (0: no total).
	StreamPaths         []string
	MaxStreamsPerClient int
	MaxStreams          int
	// JSON bounds the JSON bodies on LimitedPrefixes before they are
	// decoded; DecodeMemoryBytes bounds those bodies and what decoding
	// them is estimated to allocate, all requests together (0: no bound).
	JSON              jsonlimit.Limits
	DecodeMemoryBytes int64
}

// Guard holds the compiled rules.
type Guard struct {
	opts      Options
	hosts     map[string]bool
	anyIP     bool
	formPaths map[string]bool
	streams   *streams
	decode    *membudget.Budget
}

// New compiles the options.
func New(opts Options) *Guard {
	g := &Guard{opts: opts, hosts: map[string]bool{}, formPaths: map[string]bool{},
		streams: newStreams(opts.MaxStreamsPerClient, opts.MaxStreams, opts.StreamPaths),
		decode:  membudget.New(opts.DecodeMemoryBytes)}
	if opts.DecodeMemoryBytes <= 0 {
		g.decode = membudget.New(math.MaxInt64)
	}
	host, _, err := net.SplitHostPort(opts.Listen)
	if err != nil {
		host = opts.Listen
	}
	if !loopback.IsWildcard(host) {
		g.hosts[normHost(host)] = true
	}
	// Beyond loopback the bearer token attributes requests; an IP literal
	// cannot be rebound by a web page, so any of the box's addresses works.
	g.anyIP = !loopback.ListensOnly(opts.Listen)
	for _, h := range opts.AllowedHosts {
		g.hosts[normHost(h)] = true
	}
	for _, p := range opts.FormPaths {
		g.formPaths[p] = true
	}
	return g
}

// Refusal is the JSON body of every refusal: the same {"error","detail"}
// shape as the API's errors, with the rule that fired.
type Refusal struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
	Rule   string `json:"rule"`
}

// Middleware is the guard for echo's Pre stage (before routing, before any
// authentication): a refused request never reaches a handler.
func (g *Guard) Middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if g.opts.WriteTimeout > 0 { // first: refusals are answers too
			var rearm func()
			c.Response().Writer, rearm = withWriteDeadline(c.Response().Writer, g.opts.WriteTimeout)
			defer rearm()
		}
		if !g.HostAllowed(r.Host) {
			return refuse(c, http.StatusMisdirectedRequest, "host",
				fmt.Sprintf("this daemon does not answer to host %q (allowed: loopback names, the listen address, and http.allowed_hosts)", r.Host))
		}
		if !safeMethod(r.Method) {
			if err := sameOrigin(r, c.Scheme()); err != nil {
				return refuse(c, http.StatusForbidden, "origin", err.Error())
			}
			// OPTIONS (a CORS preflight) carries no body to type.
			if r.Method != http.MethodOptions && !g.contentTypeAllowed(r) {
				return refuse(c, http.StatusUnsupportedMediaType, "content-type",
					fmt.Sprintf("%s %s needs Content-Type: application/json (got %q)", r.Method, r.URL.Path, r.Header.Get("Content-Type")))
			}
		}
		if r.Body != nil && r.Body != http.NoBody {
			limited := g.limited(r.URL.Path) && g.opts.MaxBodyBytes > 0
			if limited && r.ContentLength > g.opts.MaxBodyBytes {
				c.Response().Header().Set("Connection", "close")
				return refuse(c, http.StatusRequestEntityTooLarge, "body-size",
					fmt.Sprintf("request body of %d bytes is larger than http.max_body_bytes (%d bytes)", r.ContentLength, g.opts.MaxBodyBytes))
			}
			if g.opts.BodyReadTimeout > 0 {
				r.Body = withReadDeadline(c.Response(), r.Body, g.opts.BodyReadTimeout)
			}
			if limited {
				done, refused, err := g.readDecodable(c)
				if refused {
					return err
				}
				defer done()
			}
		}
		return g.streams.guard(c, next)
	}
}

func (g *Guard) limited(path string) bool { return underAny(path, g.opts.LimitedPrefixes) }

// contentTypeAllowed: JSON everywhere; form types only on the panel's form
// routes; multipart only where uploads are the API's own shape.
func (g *Guard) contentTypeAllowed(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if isJSON(ct) || g.formPaths[r.URL.Path] {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "multipart/form-data" && underAny(r.URL.Path, g.opts.MultipartPrefixes)
}

func underAny(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	return false
}

// HostAllowed reports whether the daemon answers requests for this Host
// header value (with or without a port).
func (g *Guard) HostAllowed(hostport string) bool {
	if hostport == "" {
		return false // HTTP/1.1 requires Host; an HTTP/1.0 client without one is not a browser we can attribute
	}
	h := normHost(stripPort(hostport))
	if loopback.IsHost(h) || g.hosts[h] {
		return true
	}
	return g.anyIP && net.ParseIP(h) != nil
}

// refuse writes the refusal. /v1 clients get their API's error shape
// (Anthropic's on /v1/messages, OpenAI's on the rest: apishape.Refuse),
// with the rule as the code, since their SDKs show nothing else; MCP
// clients a JSON-RPC error (id null: the request was not read); the rest
// get Refusal.
func refuse(c echo.Context, status int, rule, detail string) error {
	p := c.Request().URL.Path
	if apishape.IsV1(p) {
		apishape.Refuse(c.Response(), p, status, "frontdoor_"+strings.ReplaceAll(rule, "-", "_"), detail)
		return nil
	}
	if p == "/mcp" && c.Request().Method == http.MethodPost {
		return c.JSON(status, rpcRefusal{JSONRPC: "2.0", Error: rpcError{Code: -32600, Message: detail, Data: map[string]string{"rule": rule}}})
	}
	return c.JSON(status, Refusal{Error: strings.ToLower(http.StatusText(status)), Detail: detail, Rule: rule})
}

// rpcRefusal is a JSON-RPC 2.0 error response.
type rpcRefusal struct {
	JSONRPC string   `json:"jsonrpc"`
	ID      any      `json:"id"`
	Error   rpcError `json:"error"`
}

type rpcError struct {
	Code    int               `json:"code"`
	Message string            `json:"message"`
	Data    map[string]string `json:"data"`
}

// safeMethod: GET and HEAD change nothing and skip the provenance rules.
// OPTIONS does not: it is how a page on another origin asks for access
// (a CORS preflight), so it gets the origin rule like a write.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead
}

// sameOrigin refuses requests a browser marks as coming from another site,
// and requests whose Origin is not this daemon's own (scheme and Host).
func sameOrigin(r *http.Request, scheme string) error {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "cross-site", "same-site":
		return fmt.Errorf("request from another site refused (Sec-Fetch-Site: %s)", site)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("request from another origin refused: Origin %q is not an origin", truncate(origin, 200))
	}
	if !strings.EqualFold(u.Scheme, scheme) || !strings.EqualFold(u.Host, r.Host) {
		return fmt.Errorf("request from another origin refused: Origin %q is not %s://%s", truncate(origin, 200), scheme, r.Host)
	}
	return nil
}

func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

func stripPort(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

func normHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
