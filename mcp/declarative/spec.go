package declarative

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Spec is one connector file, exactly as written. It is exported so the
// file format is documented in one place (go doc); code outside this
// package gets connectors from Parse or Load, which validate it.
type Spec struct {
	// Name is the connector name and the prefix of its tool names.
	Name string `yaml:"name"`
	// Description says what system this is (for people reading the file
	// and for `gpuhost mcp tools`).
	Description string `yaml:"description"`
	// BaseURL is the absolute http(s) URL every tool path is appended to.
	BaseURL string `yaml:"base_url"`
	// Auth says where the credential goes; nil for an open API.
	Auth *Auth `yaml:"auth"`
	// Timeout bounds one call (Go duration, default 10s, at most 60s).
	Timeout string `yaml:"timeout"`
	// Tools are the tools this connector offers.
	Tools []ToolSpec `yaml:"tools"`
}

// Auth names the environment variable holding the credential and where it
// is sent; exactly one of Header and Query is set. The value itself is
// never in the file, so the file can be shared and versioned.
type Auth struct {
	Header *HeaderAuth `yaml:"header"`
	Query  *QueryAuth  `yaml:"query"`
}

// HeaderAuth sends Prefix + secret in the header Name.
type HeaderAuth struct {
	Name   string `yaml:"name"`
	Env    string `yaml:"env"`
	Prefix string `yaml:"prefix"`
}

// QueryAuth sends the secret as the query parameter Name.
type QueryAuth struct {
	Name string `yaml:"name"`
	Env  string `yaml:"env"`
}

// ToolSpec is one GET endpoint offered as the tool <connector>_<name>.
type ToolSpec struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Method may be omitted; when written it must be GET, because MCP
	// tools only read (docs/design.md decision 1).
	Method string `yaml:"method"`
	// Path is appended to BaseURL; {param} placeholders are filled from
	// parameters declared with in: path.
	Path   string      `yaml:"path"`
	Params []ParamSpec `yaml:"params"`
	// Select is an optional RFC 6901 JSON pointer into the response; only
	// that part is returned to the model.
	Select string `yaml:"select"`
}

// ParamSpec is one typed parameter the model fills.
type ParamSpec struct {
	Name string `yaml:"name"`
	// In is "path" or "query".
	In string `yaml:"in"`
	// Type is string, integer, date (YYYY-MM-DD) or enum.
	Type string `yaml:"type"`
	// Values are the allowed values of an enum parameter.
	Values []string `yaml:"values"`
	// Required marks a query parameter as mandatory; path parameters are
	// always required (writing required: false for one is an error).
	Required    *bool  `yaml:"required"`
	Description string `yaml:"description"`
}

// Limits that keep a file (and the fuzzer) from building something absurd.
const (
	maxFileBytes     = 1 << 20
	maxTools         = 64
	maxParams        = 32
	maxEnumValues    = 256
	maxValueLen      = 200
	maxToolNameLen   = 64 // what MCP clients such as Claude Code accept
	defaultTimeout   = 10 * time.Second
	maxTimeout       = 60 * time.Second
	maxStringArgLen  = 256
	paramTypeString  = "string"
	paramTypeInteger = "integer"
	paramTypeDate    = "date"
	paramTypeEnum    = "enum"
)

var (
	nameRE      = regexp.MustCompile(`^[a-z0-9_]+$`)
	paramNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	envNameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	headerRE    = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`)
	// pathLitRE is what may appear literally in a path template: RFC 3986
	// pchar plus "/", with percent escapes checked separately.
	pathLitRE = regexp.MustCompile(`^[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*$`)
)

// Parse parses and validates one connector file; file names it in errors
// (use the path the operator will recognise). Every problem found is
// reported, each prefixed with the file and the key path.
func Parse(file string, data []byte) (*Connector, error) {
	spec, err := parseSpec(file, data)
	if err != nil {
		return nil, err
	}
	return newConnector(file, spec)
}

// parseSpec decodes strictly: first a walk over the YAML tree that names
// unknown keys by path (yaml.v3 only names the Go type), then a
// KnownFields decode as the backstop for anything the walk does not see
// (aliases, type errors with line numbers).
func parseSpec(file string, data []byte) (*Spec, error) {
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("%s: file is %d bytes, more than the %d a connector file may have", file, len(data), maxFileBytes)
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty file: a connector file needs name, base_url and tools", file)
		}
		return nil, fmt.Errorf("%s: parse YAML: %w", file, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil && extra.Kind != 0 {
		return nil, fmt.Errorf("%s: more than one YAML document; put each connector in its own file", file)
	} else if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: parse YAML: %w", file, err)
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: line %d: the file must be a mapping with name, base_url and tools", file, doc.Line)
	}
	if err := checkKeys(doc, reflect.TypeFor[Spec](), ""); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var spec Spec
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(&spec); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if errs := validate(&spec); len(errs) > 0 {
		for i, e := range errs {
			errs[i] = fmt.Errorf("%s: %w", file, e)
		}
		return nil, errors.Join(errs...)
	}
	return &spec, nil
}

// checkKeys walks node against the yaml tags of t and reports the first
// unknown key with its path and the keys that are allowed there. Aliases
// are not followed (the strict decode checks them), which also bounds the
// walk by the size of the file.
func checkKeys(node *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if node.Kind != yaml.MappingNode {
			return nil // a type error; the strict decode reports it with its line
		}
		allowed := map[string]reflect.Type{}
		var names []string
		for f := range t.Fields() {
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			allowed[tag] = f.Type
			names = append(names, tag)
		}
		for i := 0; i+1 < len(node.Content); i += 2 {
			k, v := node.Content[i], node.Content[i+1]
			ft, ok := allowed[k.Value]
			if !ok || k.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: %s: unknown key (allowed here: %s)", k.Line, joinPath(path, k.Value), strings.Join(names, ", "))
			}
			if err := checkKeys(v, ft, joinPath(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if node.Kind != yaml.SequenceNode {
			return nil
		}
		for i, item := range node.Content {
			if err := checkKeys(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// validate checks everything the types cannot say, returning one error per
// problem, each naming its key path.
func validate(s *Spec) []error {
	var errs []error
	add := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	if !nameRE.MatchString(s.Name) {
		add("name", "%q must be lower-case letters, digits and _ (it becomes the tool prefix)", s.Name)
	}
	if _, err := parseBaseURL(s.BaseURL); err != nil {
		add("base_url", "%v", err)
	}
	if s.Timeout != "" {
		d, err := time.ParseDuration(s.Timeout)
		switch {
		case err != nil:
			add("timeout", "%q is not a duration such as 10s", s.Timeout)
		case d <= 0 || d > maxTimeout:
			add("timeout", "%s must be above 0 and at most %s", d, maxTimeout)
		}
	}
	authQuery := ""
	if s.Auth != nil {
		switch {
		case s.Auth.Header != nil && s.Auth.Query != nil:
			add("auth", "set either header or query, not both")
		case s.Auth.Header != nil:
			h := s.Auth.Header
			if !headerRE.MatchString(h.Name) {
				add("auth.header.name", "%q is not a valid HTTP header name", h.Name)
			}
			if !envNameRE.MatchString(h.Env) {
				add("auth.header.env", "%q must name an environment variable (the secret itself never goes in the file)", h.Env)
			}
			if strings.ContainsFunc(h.Prefix, isControl) {
				add("auth.header.prefix", "must not contain control characters")
			}
		case s.Auth.Query != nil:
			q := s.Auth.Query
			if !paramNameRE.MatchString(q.Name) {
				add("auth.query.name", "%q must be letters, digits and _", q.Name)
			}
			if !envNameRE.MatchString(q.Env) {
				add("auth.query.env", "%q must name an environment variable (the secret itself never goes in the file)", q.Env)
			}
			authQuery = q.Name
		default:
			add("auth", "set header: {name, env, prefix} or query: {name, env}, or remove auth for an open API")
		}
	}
	if len(s.Tools) == 0 {
		add("tools", "at least one tool is needed")
	}
	if len(s.Tools) > maxTools {
		add("tools", "%d tools; at most %d per file", len(s.Tools), maxTools)
		return errs
	}
	seen := map[string]bool{}
	for i := range s.Tools {
		errs = append(errs, validateTool(s.Name, &s.Tools[i], fmt.Sprintf("tools[%d]", i), authQuery, seen)...)
	}
	return errs
}

func validateTool(connector string, t *ToolSpec, key, authQuery string, seen map[string]bool) []error {
	var errs []error
	add := func(sub, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", joinPath(key, sub), fmt.Sprintf(format, a...)))
	}
	switch {
	case !nameRE.MatchString(t.Name):
		add("name", "%q must be lower-case letters, digits and _", t.Name)
	case seen[t.Name]:
		add("name", "tool %q is defined twice", t.Name)
	case len(connector)+1+len(t.Name) > maxToolNameLen:
		add("name", "%s_%s is longer than the %d characters MCP clients accept", connector, t.Name, maxToolNameLen)
	}
	seen[t.Name] = true
	if strings.TrimSpace(t.Description) == "" {
		add("description", "is required: it is what the model reads to choose the tool")
	}
	if t.Method != "" && !strings.EqualFold(t.Method, "GET") {
		add("method", "%q is not allowed: declarative tools only read, so only GET is accepted", t.Method)
	}
	if len(t.Params) > maxParams {
		add("params", "%d parameters; at most %d", len(t.Params), maxParams)
		return errs
	}
	pathParams := map[string]bool{}
	names := map[string]bool{}
	for j := range t.Params {
		p := &t.Params[j]
		pk := fmt.Sprintf("params[%d]", j)
		switch {
		case !paramNameRE.MatchString(p.Name):
			add(pk+".name", "%q must be letters, digits and _", p.Name)
		case names[p.Name]:
			add(pk+".name", "parameter %q is declared twice", p.Name)
		case p.In == "query" && p.Name == authQuery:
			add(pk+".name", "%q is the auth query parameter; the model cannot set it", p.Name)
		}
		names[p.Name] = true
		switch p.In {
		case "path":
			pathParams[p.Name] = true
			if p.Required != nil && !*p.Required {
				add(pk+".required", "path parameters are always required")
			}
		case "query":
		default:
			add(pk+".in", "%q must be path or query", p.In)
		}
		switch p.Type {
		case paramTypeString, paramTypeInteger, paramTypeDate:
			if len(p.Values) > 0 {
				add(pk+".values", "only enum parameters take values (type is %s)", p.Type)
			}
		case paramTypeEnum:
			if len(p.Values) == 0 {
				add(pk+".values", "an enum needs at least one value")
			}
			if len(p.Values) > maxEnumValues {
				add(pk+".values", "%d values; at most %d", len(p.Values), maxEnumValues)
			}
			for k, v := range p.Values {
				switch {
				case v == "" || len(v) > maxValueLen || strings.ContainsFunc(v, isControl):
					add(fmt.Sprintf("%s.values[%d]", pk, k), "%q must be 1 to %d printable characters", v, maxValueLen)
				case slices.Index(p.Values, v) != k:
					add(fmt.Sprintf("%s.values[%d]", pk, k), "%q is listed twice", v)
				case p.In == "path" && (v == "." || v == ".."):
					add(fmt.Sprintf("%s.values[%d]", pk, k), "%q cannot be a path segment", v)
				}
			}
		default:
			add(pk+".type", "%q must be string, integer, date or enum", p.Type)
		}
	}
	used, err := templateParams(t.Path)
	if err != nil {
		add("path", "%v", err)
	}
	for _, u := range used {
		if !pathParams[u] {
			add("path", "placeholder {%s} has no parameter declared with in: path", u)
		}
	}
	for p := range pathParams {
		if !slices.Contains(used, p) {
			add("path", "path parameter %q is declared but the path has no {%s}", p, p)
		}
	}
	if _, err := parsePointer(t.Select); err != nil {
		add("select", "%v", err)
	}
	return errs
}

// parseBaseURL accepts only absolute http(s) URLs without credentials,
// query or fragment, so the file cannot smuggle a secret or a parameter
// past the typed ones.
func parseBaseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("is required (an absolute http or https URL)")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%q must be an absolute http or https URL", s)
	case u.Host == "" || u.Opaque != "":
		return nil, fmt.Errorf("%q has no host", s)
	case u.User != nil:
		return nil, fmt.Errorf("%q carries credentials; use auth with an environment variable instead", redactUser(u))
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("%q has a query; declare query parameters on the tools instead", s)
	case u.Fragment != "":
		return nil, fmt.Errorf("%q has a fragment", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = strings.TrimSuffix(u.RawPath, "/")
	return u, nil
}

func redactUser(u *url.URL) string {
	c := *u
	c.User = url.User("REDACTED")
	return c.String()
}

// templateParams returns the {placeholders} of a path template in order
// and checks the literal parts are plain path characters with no query,
// fragment or dot segments.
func templateParams(path string) ([]string, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("%q must start with /", path)
	}
	var params []string
	var lit strings.Builder
	rest := path
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			lit.WriteString(rest)
			break
		}
		if rest[open] == '}' {
			return nil, fmt.Errorf("%q has a } without {", path)
		}
		lit.WriteString(rest[:open])
		end := strings.IndexAny(rest[open+1:], "{}")
		if end < 0 || rest[open+1+end] != '}' {
			return nil, fmt.Errorf("%q has an unclosed {", path)
		}
		name := rest[open+1 : open+1+end]
		if !paramNameRE.MatchString(name) {
			return nil, fmt.Errorf("%q: placeholder {%s} must be a parameter name", path, name)
		}
		params = append(params, name)
		lit.WriteString("x") // stands for the escaped value in the checks below
		rest = rest[open+1+end+1:]
	}
	l := lit.String()
	if !pathLitRE.MatchString(l) {
		return nil, fmt.Errorf("%q may only hold path characters (no ?, #, spaces: declare query parameters instead)", path)
	}
	if _, err := url.PathUnescape(l); err != nil {
		return nil, fmt.Errorf("%q has a bad %% escape", path)
	}
	for seg := range strings.SplitSeq(l, "/") {
		if seg == "." || seg == ".." {
			return nil, fmt.Errorf("%q has a . or .. segment", path)
		}
	}
	return params, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
