package declarative

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"gpuhost/mcp/connector"
)

const (
	// maxResponseBytes caps what is read from the API: a model cannot use
	// more, and a runaway endpoint must not fill memory.
	maxResponseBytes = 4 << 20
	// excerptLen is how much of an error body is quoted back.
	excerptLen  = 200
	datePattern = `^[0-9]{4}-[0-9]{2}-[0-9]{2}$`
)

// Connector is one validated declarative connector. It implements
// connector.Connector, so the registry applies the same policy to it as to a
// compiled one.
type Connector struct {
	file    string
	spec    *Spec
	base    *url.URL
	timeout time.Duration
	tools   []compiledTool
}

type compiledTool struct {
	spec *ToolSpec
	sel  pointer
}

var _ connector.Connector = (*Connector)(nil)

func newConnector(file string, spec *Spec) (*Connector, error) {
	base, err := parseBaseURL(spec.BaseURL)
	if err != nil { // validate already checked; keep the guard cheap and explicit
		return nil, fmt.Errorf("%s: base_url: %w", file, err)
	}
	c := &Connector{file: file, spec: spec, base: base, timeout: defaultTimeout}
	if spec.Timeout != "" {
		if c.timeout, err = time.ParseDuration(spec.Timeout); err != nil {
			return nil, fmt.Errorf("%s: timeout: %w", file, err)
		}
	}
	for i := range spec.Tools {
		sel, err := parsePointer(spec.Tools[i].Select)
		if err != nil {
			return nil, fmt.Errorf("%s: tools[%d].select: %w", file, i, err)
		}
		c.tools = append(c.tools, compiledTool{spec: &spec.Tools[i], sel: sel})
	}
	return c, nil
}

// Name is the connector name from the file (the tool prefix).
func (c *Connector) Name() string { return c.spec.Name }

// File is the file the connector was read from, for messages.
func (c *Connector) File() string { return c.file }

// Build returns one read-only tool per tools entry, named
// <connector>_<tool>. A declarative connector is configured by its file
// alone, so a non-empty mcp.connectors.<name> section is refused rather
// than silently ignored.
func (c *Connector) Build(env connector.Env) ([]connector.Tool, error) {
	if err := connector.DecodeConfig(env, &struct{}{}); err != nil {
		return nil, fmt.Errorf("connector %s is declared in %s; its mcp.connectors section must stay empty: %w", c.spec.Name, c.file, err)
	}
	client := &http.Client{Timeout: c.timeout}
	if env.HTTP != nil {
		cp := *env.HTTP
		client = &cp
	}
	// Never follow redirects: a custom auth header would travel to
	// whatever host the Location names.
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	tools := make([]connector.Tool, 0, len(c.tools))
	for i := range c.tools {
		t := &c.tools[i]
		call := &caller{c: c, t: t, env: env, client: client, full: c.spec.Name + "_" + t.spec.Name}
		tools = append(tools, connector.Tool{Def: c.toolDef(call.full, t.spec), Handler: call.handle})
	}
	return tools, nil
}

// toolDef builds the MCP definition: typed properties, enums for enum
// parameters, a pattern and format for dates, no extra properties.
func (c *Connector) toolDef(full string, t *ToolSpec) mcpgo.Tool {
	opts := []mcpgo.ToolOption{
		mcpgo.WithDescription(strings.TrimSpace(t.Description)),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithIdempotentHintAnnotation(true),
		mcpgo.WithOpenWorldHintAnnotation(true),
		mcpgo.WithSchemaAdditionalProperties(false),
	}
	for i := range t.Params {
		p := &t.Params[i]
		var po []mcpgo.PropertyOption
		desc := strings.TrimSpace(p.Description)
		if p.required() {
			po = append(po, mcpgo.Required())
		}
		switch p.Type {
		case paramTypeInteger:
			if desc != "" {
				po = append(po, mcpgo.Description(desc))
			}
			opts = append(opts, mcpgo.WithInteger(p.Name, po...))
			continue
		case paramTypeDate:
			desc = strings.TrimSpace(desc + " (date, YYYY-MM-DD)")
			po = append(po, mcpgo.Pattern(datePattern), func(m map[string]any) { m["format"] = "date" })
		case paramTypeEnum:
			po = append(po, mcpgo.Enum(slices.Clone(p.Values)...))
		default:
			po = append(po, mcpgo.MinLength(1), mcpgo.MaxLength(maxStringArgLen))
		}
		if desc != "" {
			po = append(po, mcpgo.Description(desc))
		}
		opts = append(opts, mcpgo.WithString(p.Name, po...))
	}
	return mcpgo.NewTool(full, opts...)
}

func (p *ParamSpec) required() bool {
	return p.In == "path" || (p.Required != nil && *p.Required)
}

// caller runs one tool.
type caller struct {
	c      *Connector
	t      *compiledTool
	env    connector.Env
	client *http.Client
	full   string
}

// handle turns the arguments into one GET, checks the answer is JSON and
// returns the selected part. The secret is read here, per call.
func (k *caller) handle(ctx context.Context, args connector.Args) (any, error) {
	reqURL, err := k.buildURL(args)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.full, err)
	}
	// shown is the URL as it may appear in messages: no query, so a query
	// key can never be quoted back.
	shown := reqURL.Scheme + "://" + reqURL.Host + reqURL.EscapedPath()

	var secret string
	var authHeader, authValue string
	if a := k.c.spec.Auth; a != nil {
		envVar := a.envVar()
		if k.env.Secrets == nil {
			return nil, &connector.MissingSecretError{Name: envVar}
		}
		if secret, err = k.env.Secrets.Get(envVar); err != nil {
			return nil, err // *connector.MissingSecretError naming the variable
		}
		if a.Header != nil {
			authHeader, authValue = a.Header.Name, a.Header.Prefix+secret
		} else {
			q := reqURL.Query()
			q.Set(a.Query.Name, secret)
			reqURL.RawQuery = q.Encode()
		}
	}
	scrub := func(s string) string {
		if secret == "" {
			return s
		}
		for _, form := range secretForms(secret) {
			s = strings.ReplaceAll(s, form, connector.Redacted)
		}
		return s
	}

	ctx, cancel := context.WithTimeout(ctx, k.c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, reqURL.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: build request for %s: %s", k.full, shown, scrub(err.Error()))
	}
	if authHeader != "" {
		req.Header.Set(authHeader, authValue)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "gpuhost-mcp/"+k.c.spec.Name)

	start := time.Now()
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, k.transportError(ctx, shown, err, time.Since(start), scrub)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, k.transportError(ctx, shown, err, time.Since(start), scrub)
	}
	status := resp.Status
	if status == "" {
		status = strconv.Itoa(resp.StatusCode)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("%s: the %s API answered %s for GET %s%s: %s", k.full, k.c.spec.Name, status, shown, statusHint(resp.StatusCode, k.c.spec.Auth), excerpt(body, scrub))
	}
	if len(body) > maxResponseBytes {
		return nil, fmt.Errorf("%s: the %s API answered more than %d MiB for GET %s; narrow the query (dates, filters)", k.full, k.c.spec.Name, maxResponseBytes>>20, shown)
	}
	ct := resp.Header.Get("Content-Type")
	if !isJSONType(ct) {
		return nil, fmt.Errorf("%s: the %s API answered %s with %q instead of JSON for GET %s (a login page or proxy error?): %s", k.full, k.c.spec.Name, status, scrub(ct), shown, excerpt(body, scrub))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: the %s API answered %s with invalid JSON for GET %s (%s): %s", k.full, k.c.spec.Name, status, shown, scrub(err.Error()), excerpt(body, scrub))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: the %s API answered %s with trailing data after the JSON for GET %s: %s", k.full, k.c.spec.Name, status, shown, excerpt(body, scrub))
	}
	sel, err := k.t.sel.resolve(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s (select %s in %s; the API's answer has another shape)", k.full, errSelect, scrub(err.Error()), k.t.sel, k.c.file)
	}
	if secret != "" {
		sel = scrubValue(sel, scrub)
	}
	return sel, nil
}

// buildURL fills the path template and query from the typed arguments;
// nothing the model sends can change the host, the path structure or the
// set of query keys.
func (k *caller) buildURL(args connector.Args) (*url.URL, error) {
	for name := range args {
		if !slices.ContainsFunc(k.t.spec.Params, func(p ParamSpec) bool { return p.Name == name }) {
			return nil, fmt.Errorf("unknown parameter %q; this tool takes: %s", truncate(name), k.paramNames())
		}
	}
	values := map[string]string{}
	query := url.Values{}
	for i := range k.t.spec.Params {
		p := &k.t.spec.Params[i]
		raw, present := args[p.Name]
		if !present || raw == nil {
			if p.required() {
				return nil, fmt.Errorf("missing required parameter %q (%s)", p.Name, p.typeHint())
			}
			continue
		}
		v, err := p.format(raw)
		if err != nil {
			return nil, fmt.Errorf("parameter %q: %w", p.Name, err)
		}
		if p.In == "path" {
			if v == "." || v == ".." {
				return nil, fmt.Errorf("parameter %q: %q is not a valid value", p.Name, v)
			}
			values[p.Name] = url.PathEscape(v)
		} else {
			query.Set(p.Name, v)
		}
	}
	var raw strings.Builder
	rest := k.t.spec.Path
	for {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			raw.WriteString(rest)
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		raw.WriteString(rest[:open])
		raw.WriteString(values[rest[open+1:open+end]])
		rest = rest[open+end+1:]
	}
	u := *k.c.base
	rawPath := u.EscapedPath() + raw.String()
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		return nil, fmt.Errorf("build path: %w", err)
	}
	u.Path, u.RawPath = path, rawPath
	u.RawQuery = query.Encode()
	return &u, nil
}

func (k *caller) paramNames() string {
	if len(k.t.spec.Params) == 0 {
		return "no parameters"
	}
	names := make([]string, len(k.t.spec.Params))
	for i, p := range k.t.spec.Params {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// format checks one argument against its declared type (the registry
// validates the schema too; this is the second layer) and returns its
// wire form.
func (p *ParamSpec) format(raw any) (string, error) {
	switch p.Type {
	case paramTypeInteger:
		var f float64
		switch n := raw.(type) {
		case float64:
			f = n
		case json.Number:
			var err error
			if f, err = n.Float64(); err != nil {
				return "", fmt.Errorf("%q is not an integer", n.String())
			}
		case int:
			f = float64(n)
		case int64:
			f = float64(n)
		default:
			return "", fmt.Errorf("want an integer, got %s", jsonKind(raw))
		}
		if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return "", fmt.Errorf("%v is not an integer", f)
		}
		return strconv.FormatInt(int64(f), 10), nil
	}
	s, ok := raw.(string)
	if !ok {
		return "", fmt.Errorf("want %s, got %s", p.typeHint(), jsonKind(raw))
	}
	switch p.Type {
	case paramTypeDate:
		if _, err := time.Parse(time.DateOnly, s); err != nil || len(s) != len(time.DateOnly) {
			return "", fmt.Errorf("%q is not a date; write YYYY-MM-DD, e.g. 2026-03-31", truncate(s))
		}
	case paramTypeEnum:
		if !slices.Contains(p.Values, s) {
			return "", fmt.Errorf("%q is not allowed; choose one of: %s", truncate(s), strings.Join(p.Values, ", "))
		}
	default:
		if s == "" || utf8.RuneCountInString(s) > maxStringArgLen || !utf8.ValidString(s) || strings.ContainsFunc(s, isControl) {
			return "", fmt.Errorf("want 1 to %d printable characters", maxStringArgLen)
		}
	}
	return s, nil
}

func (p *ParamSpec) typeHint() string {
	switch p.Type {
	case paramTypeDate:
		return "a date YYYY-MM-DD"
	case paramTypeEnum:
		return "one of: " + strings.Join(p.Values, ", ")
	case paramTypeInteger:
		return "an integer"
	}
	return "a string"
}

// transportError explains a failed exchange without the *url.Error text,
// which quotes the full URL and with it a query-string key.
func (k *caller) transportError(ctx context.Context, shown string, err error, took time.Duration, scrub func(string) string) error {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return fmt.Errorf("%s: the %s API did not answer GET %s within %s (timeout %s, set in %s); it may be down or overloaded, try again later", k.full, k.c.spec.Name, shown, took.Round(100*time.Millisecond), k.c.timeout, k.c.file)
	case errors.Is(err, context.Canceled) || ctx.Err() != nil:
		return fmt.Errorf("%s: the call was cancelled before the %s API answered GET %s", k.full, k.c.spec.Name, shown)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("%s: GET %s failed: %s (is the %s API reachable from this host?)", k.full, shown, scrub(err.Error()), k.c.spec.Name)
}

func statusHint(code int, auth *Auth) string {
	switch {
	case (code == http.StatusUnauthorized || code == http.StatusForbidden) && auth != nil:
		return " (the credential in " + auth.envVar() + " was refused; the operator must fix it)"
	case code == http.StatusNotFound:
		return " (not found: check the parameter values)"
	case code == http.StatusBadRequest:
		return " (the API rejected the parameters)"
	case code >= 300 && code < 400:
		return " (a redirect, which is not followed: fix base_url)"
	case code >= 500:
		return " (a server error: try again later)"
	}
	return ""
}

// envVar is the variable holding the credential (validate ensures exactly
// one of Header and Query is set).
func (a *Auth) envVar() string {
	if a.Header != nil {
		return a.Header.Env
	}
	if a.Query != nil {
		return a.Query.Env
	}
	return ""
}

// isJSONType accepts JSON media types only; a missing Content-Type is
// refused too, because HTML error pages are the common case without one.
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// excerpt quotes the start of a body on one line, secrets scrubbed, so an
// error tells the model (and the operator) what the API said.
func excerpt(body []byte, scrub func(string) string) string {
	s := scrub(strings.ToValidUTF8(string(body), "?"))
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || isControl(r) }), " ")
	if s == "" {
		return "(empty body)"
	}
	if utf8.RuneCountInString(s) > excerptLen {
		r := []rune(s)
		s = string(r[:excerptLen]) + "…"
	}
	// Scrubbed before truncating (a cut secret could not be matched after)
	// and again after joining fields, which could rejoin a secret that held
	// a run of blanks.
	return fmt.Sprintf("%q", scrub(s))
}

// secretForms are the spellings of a secret an API may echo: plain, URL
// query and path escaped, and JSON-string escaped.
func secretForms(secret string) []string {
	forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret)}
	if j, err := json.Marshal(secret); err == nil && len(j) > 2 {
		forms = append(forms, string(j[1:len(j)-1]))
	}
	return forms
}

func truncate(s string) string {
	if utf8.RuneCountInString(s) <= 40 {
		return s
	}
	return string([]rune(s)[:40]) + "…"
}

// scrubValue replaces the secret in every string (and key) of a decoded
// JSON value, for APIs that echo the caller's credential.
func scrubValue(v any, scrub func(string) string) any {
	switch t := v.(type) {
	case string:
		return scrub(t)
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[scrub(k)] = scrubValue(e, scrub)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = scrubValue(e, scrub)
		}
		return out
	}
	return v
}
