package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"gopkg.in/yaml.v3"
)

// DefaultCallTimeout bounds one tool call when ServerOptions.CallTimeout
// is zero: long enough for a slow NAS login, short enough that a model is
// not left waiting on a dead device.
const DefaultCallTimeout = 30 * time.Second

// ServerOptions configure NewServer. Only Config is needed; every other
// field has a production default.
type ServerOptions struct {
	// Config is mcp.connectors from gpuhost.yaml: a connector is enabled
	// when its section exists (an empty mapping enables it with defaults).
	Config map[string]yaml.Node
	// Secrets hands out credentials at call time (default: the process
	// environment).
	Secrets *connector.Secrets
	// Daemon is the running appliance, handed to every connector as
	// Env.Daemon (nil outside the daemon); untyped because the server does
	// not read it, the gpu and inference connectors assert what they need.
	Daemon any
	// HTTP is the client connectors use (default: 30 s timeout).
	HTTP *http.Client
	// Log receives the audit log and build messages (default: discarded).
	Log *slog.Logger
	// Extra are connectors built elsewhere (declarative ones); each is
	// enabled unconditionally under its Name, with Config[Name] as its
	// section if present.
	Extra []connector.Named
	// Factories replaces the registry (tests; default connector.Factories()).
	Factories map[string]connector.Factory
	// CallTimeout bounds each tool call (default DefaultCallTimeout).
	CallTimeout time.Duration
	// Version is reported to clients in the initialize result.
	Version string
	// MaxSessions caps the streamable HTTP sessions kept at once
	// (mcp.max_sessions; default DefaultMaxSessions).
	MaxSessions int
}

// ToolInfo is a registered tool and the connector it came from.
type ToolInfo struct {
	Connector string
	Tool      connector.Tool
}

// Server is gpuhost's MCP server: mcp-go's server carrying the tools of
// every enabled connector that passed the policy checks, each wrapped with
// validation, a timeout, panic recovery, secret scrubbing and an audit log.
type Server struct {
	mcp     *server.MCPServer
	opts    ServerOptions
	sc      *scrubber
	log     *slog.Logger
	timeout time.Duration

	mu         sync.RWMutex // guards the fields below (ReloadExtra)
	extraNames map[string]bool
	extraOff   []string // disabled entries extraCandidates made
	tools      []ToolInfo
	enabled    []string
	disabled   map[string]string
}

// toolNameRE is the MCP spec's tool name alphabet and length.
var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// NewServer builds every enabled connector and registers the tools that
// pass the policy (decisions 1 and 2 of docs/design.md). A connector whose
// Build fails, or any of whose tools breaks a rule, is disabled whole
// (listed by Disabled with the reason) so a half-checked connector never
// serves; the others carry on. NewServer itself fails only on options it
// cannot work with.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.Secrets == nil {
		opts.Secrets = connector.NewSecrets(os.LookupEnv)
	}
	if opts.HTTP == nil {
		opts.HTTP = &http.Client{Timeout: DefaultCallTimeout}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Factories == nil {
		opts.Factories = connector.Factories()
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	sc := newScrubber(opts.Secrets)
	s := &Server{
		mcp: server.NewMCPServer("gpuhost", opts.Version,
			server.WithToolCapabilities(true),
			server.WithInstructions("Read-only tools of a gpuhost inference box and the systems configured for it. Targets are fixed names from the enum in each tool's schema."),
		),
		opts:     opts,
		sc:       sc,
		log:      scrubLogger(opts.Log, sc),
		timeout:  opts.CallTimeout,
		disabled: map[string]string{},
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	extra := s.extraCandidates(opts.Extra)
	cands := slices.Clone(extra)
	for name := range opts.Config {
		if s.extraNames[name] {
			continue
		}
		f := opts.Factories[name]
		if f == nil {
			known := make([]string, 0, len(opts.Factories))
			for n := range opts.Factories {
				known = append(known, n)
			}
			sort.Strings(known)
			s.disable(name, fmt.Errorf("mcp.connectors.%s: no such connector (built in: %s)", name, strings.Join(known, ", ")))
			continue
		}
		cands = append(cands, candidate{name, f()})
	}
	s.install(cands)
	return s, nil
}

type candidate struct {
	name string
	conn connector.Connector
}

// extraCandidates checks the names of declarative connectors and records
// them (also the refused ones) so ReloadExtra can replace them all.
func (s *Server) extraCandidates(extra []connector.Named) []candidate {
	s.extraNames = map[string]bool{}
	s.extraOff = nil
	var out []candidate
	for _, nc := range extra {
		if nc.Connector == nil || nc.Name == "" || s.extraNames[nc.Name] || s.opts.Factories[nc.Name] != nil {
			s.extraOff = append(s.extraOff, nc.Name)
		}
		switch {
		case nc.Connector == nil || nc.Name == "":
			s.disable(nc.Name, errors.New("declarative connector without a name or body"))
			continue
		case s.extraNames[nc.Name]:
			s.disable(nc.Name, fmt.Errorf("two declarative connectors are named %q", nc.Name))
			continue
		case s.opts.Factories[nc.Name] != nil:
			s.disable(nc.Name, fmt.Errorf("declarative connector %q has the name of a built-in connector; rename its file", nc.Name))
			continue
		}
		s.extraNames[nc.Name] = true
		out = append(out, candidate{nc.Name, nc.Connector})
	}
	return out
}

// install builds candidates and registers the tools of those that pass;
// s.mu is held.
func (s *Server) install(cands []candidate) {
	sort.Slice(cands, func(i, j int) bool { return cands[i].name < cands[j].name })
	for _, c := range cands {
		env := connector.Env{
			Name:    c.name,
			Config:  s.opts.Config[c.name],
			Secrets: s.opts.Secrets,
			HTTP:    s.opts.HTTP,
			Log:     scrubLogger(s.opts.Log, s.sc).With("connector", c.name),
			Daemon:  s.opts.Daemon,
		}
		tools, err := safeBuild(c.conn, env)
		if err != nil {
			s.disable(c.name, fmt.Errorf("build: %w", err))
			continue
		}
		checked, err := checkTools(c.name, tools)
		if err != nil {
			s.disable(c.name, err)
			continue
		}
		for _, ct := range checked {
			s.mcp.AddTool(ct.tool.Def, s.wrap(c.name, ct.tool, ct.schema))
			s.tools = append(s.tools, ToolInfo{Connector: c.name, Tool: ct.tool})
		}
		s.enabled = append(s.enabled, c.name)
		s.log.Info("mcp connector enabled", "connector", c.name, "tools", len(checked))
	}
	sort.Slice(s.tools, func(i, j int) bool { return s.tools[i].Tool.Def.Name < s.tools[j].Tool.Def.Name })
	sort.Strings(s.enabled)
}

// ReloadExtra replaces the declarative connectors (SIGHUP): the old ones'
// tools are removed, the new ones go through the same checks, and
// connected clients get a tools/list_changed notification. Compiled
// connectors are untouched.
func (s *Server) ReloadExtra(extra []connector.Named) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []string
	kept := s.tools[:0]
	for _, ti := range s.tools {
		if s.extraNames[ti.Connector] {
			gone = append(gone, ti.Tool.Def.Name)
			continue
		}
		kept = append(kept, ti)
	}
	s.tools = kept
	s.enabled = slices.DeleteFunc(s.enabled, func(n string) bool { return s.extraNames[n] })
	for n := range s.extraNames {
		delete(s.disabled, n)
	}
	for _, n := range s.extraOff {
		delete(s.disabled, n)
	}
	if len(gone) > 0 {
		s.mcp.DeleteTools(gone...)
	}
	s.install(s.extraCandidates(extra))
	s.log.Info("mcp declarative connectors reloaded", "removed_tools", len(gone), "connectors", len(s.extraNames))
}

func (s *Server) disable(name string, err error) {
	msg := s.sc.Scrub(err.Error())
	s.disabled[name] = msg
	s.log.Error("mcp connector disabled", "connector", name, "reason", msg)
}

// safeBuild keeps a connector that panics in Build from taking the
// daemon down: it is disabled like one that returned an error.
func safeBuild(c connector.Connector, env connector.Env) (tools []connector.Tool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return c.Build(env)
}

type checkedTool struct {
	tool   connector.Tool
	schema *jsonschema.Schema
}

// checkTools applies the registration rules to one connector's tools and
// compiles their input schemas; the first violation refuses them all.
func checkTools(conn string, tools []connector.Tool) ([]checkedTool, error) {
	seen := map[string]bool{}
	out := make([]checkedTool, 0, len(tools))
	for i, t := range tools {
		name := t.Def.Name
		if err := checkTool(conn, t, seen); err != nil {
			if name == "" {
				name = fmt.Sprintf("#%d", i)
			}
			return nil, fmt.Errorf("tool %s refused: %w", name, err)
		}
		seen[name] = true
		sch, err := compileSchema(t.Def)
		if err != nil {
			return nil, fmt.Errorf("tool %s refused: input schema: %w", name, err)
		}
		out = append(out, checkedTool{tool: t, schema: sch})
	}
	return out, nil
}

func checkTool(conn string, t connector.Tool, seen map[string]bool) error {
	name := t.Def.Name
	prefix := conn + "_"
	switch {
	case !toolNameRE.MatchString(name):
		return fmt.Errorf("name %q is not 1-128 characters of [A-Za-z0-9_.-]", name)
	case !strings.HasPrefix(name, prefix) || len(name) == len(prefix):
		return fmt.Errorf("name must start with %q (tool names are <connector>_<tool>)", prefix)
	case seen[name]:
		return errors.New("duplicate tool name")
	case t.Handler == nil:
		return errors.New("no handler")
	}
	a := t.Def.Annotations
	if a.ReadOnlyHint == nil || !*a.ReadOnlyHint {
		return errors.New("readOnlyHint must be true: MCP tools only read (docs/design.md decision 1)")
	}
	if a.DestructiveHint == nil || *a.DestructiveHint {
		return errors.New("destructiveHint must be set to false: MCP tools only read (docs/design.md decision 1)")
	}
	if err := checkStrict(t.Def); err != nil {
		return err
	}
	if t.Targets != nil {
		if err := checkTargets(t.Def, t.Targets); err != nil {
			return fmt.Errorf("targets: %w", err)
		}
	}
	return nil
}

// checkStrict requires additionalProperties: false on the input schema and
// on every object schema inside it, so an argument the tool does not know
// (a typo, a hallucinated option) is refused instead of silently ignored.
func checkStrict(def mcpgo.Tool) error {
	sch, err := inputSchema(def)
	if err != nil {
		return fmt.Errorf("input schema: %w", err)
	}
	if loc := notStrict(sch, ""); loc != "" {
		return fmt.Errorf("input schema is not strict: %s must have additionalProperties: false "+
			"(mcp-go: mcpgo.WithSchemaAdditionalProperties(false)) so unknown arguments are refused", loc)
	}
	return nil
}

// notStrict returns the location of the first object schema under sch
// (itself included) that allows additional properties, or "". path is
// sch's place in the arguments ("" for the top level, "a.b", "a[]").
func notStrict(sch map[string]any, path string) string {
	where := "the top-level object"
	if path != "" {
		where = "property " + path
	}
	join := func(n string) string {
		if path == "" {
			return n
		}
		return path + "." + n
	}
	isObject := sch["type"] == "object"
	if types, ok := sch["type"].([]any); ok {
		isObject = slices.Contains(types, any("object"))
	}
	_, hasProps := sch["properties"]
	_, hasPatterns := sch["patternProperties"]
	if isObject || hasProps || hasPatterns {
		if ap, ok := sch["additionalProperties"].(bool); !ok || ap {
			return where
		}
	}
	for _, key := range []string{"properties", "patternProperties"} {
		props, _ := sch[key].(map[string]any)
		names := make([]string, 0, len(props))
		for n := range props {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if sub, ok := props[n].(map[string]any); ok {
				if l := notStrict(sub, join(n)); l != "" {
					return l
				}
			}
		}
	}
	if items, ok := sch["items"].(map[string]any); ok {
		if l := notStrict(items, path+"[]"); l != "" {
			return l
		}
	}
	return ""
}

// inputSchema returns the tool's input schema as generic JSON, whichever
// of InputSchema or RawInputSchema the connector used.
func inputSchema(def mcpgo.Tool) (map[string]any, error) {
	b, err := json.Marshal(def)
	if err != nil {
		return nil, fmt.Errorf("encode tool definition: %w", err)
	}
	var doc struct {
		InputSchema map[string]any `json:"inputSchema"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("decode tool definition: %w", err)
	}
	if doc.InputSchema == nil {
		return nil, errors.New("no input schema")
	}
	return doc.InputSchema, nil
}

// checkTargets holds a tool to its word: the target parameter is a string
// whose enum is exactly the configured targets, so the model can only pick
// a configured name (docs/design.md decision 1). It may be optional (doctor of
// "the active profile" when omitted); when given it is one of the enum.
func checkTargets(def mcpgo.Tool, tg *connector.Targets) error {
	if tg.Param == "" {
		return errors.New("no parameter named")
	}
	if len(tg.Values) == 0 {
		return fmt.Errorf("parameter %q has no configured targets", tg.Param)
	}
	sch, err := inputSchema(def)
	if err != nil {
		return err
	}
	props, _ := sch["properties"].(map[string]any)
	p, ok := props[tg.Param].(map[string]any)
	if !ok {
		return fmt.Errorf("parameter %q is not in the input schema", tg.Param)
	}
	enum, _ := p["enum"].([]any)
	got := make([]string, 0, len(enum))
	for _, e := range enum {
		s, ok := e.(string)
		if !ok {
			return fmt.Errorf("parameter %q: enum value %v is not a string", tg.Param, e)
		}
		got = append(got, s)
	}
	want := slices.Clone(tg.Values)
	slices.Sort(got)
	slices.Sort(want)
	if len(enum) == 0 || !slices.Equal(got, want) {
		return fmt.Errorf("parameter %q: schema enum %v must equal the configured targets %v", tg.Param, got, want)
	}
	return nil
}

// compileSchema compiles the input schema once at registration, so a
// broken schema refuses the tool instead of silently skipping validation.
func compileSchema(def mcpgo.Tool) (*jsonschema.Schema, error) {
	doc, err := inputSchema(def)
	if err != nil {
		return nil, err
	}
	// Round-trip through the validator's own decoder (json.Number).
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	c := jsonschema.NewCompiler()
	url := "mem:///" + def.Name + ".json"
	if err := c.AddResource(url, v); err != nil {
		return nil, fmt.Errorf("add: %w", err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	return sch, nil
}

// objectArgs returns a call's arguments as an object: absent is no
// arguments; null, like anything else that is not a JSON object, is an
// error naming what was sent (a model that JSON-encodes its arguments twice
// sends a string; one that has nothing to send may send null, which the
// schema's "type": "object" does not allow either). wire is the arguments
// as they came over the wire, when the transport kept them (mcp-go keeps
// them in RawArguments; a decoded null is indistinguishable from absent).
func objectArgs(raw any, wire json.RawMessage) (map[string]any, error) {
	if isJSONNull(wire) {
		return nil, errors.New("arguments must be a JSON object, got null (omit arguments instead)")
	}
	if rm, ok := raw.(json.RawMessage); ok {
		// Transports that hand over undecoded arguments.
		if isJSONNull(rm) {
			return nil, errors.New("arguments must be a JSON object, got null (omit arguments instead)")
		}
		raw = nil
		if len(bytes.TrimSpace(rm)) > 0 {
			if err := json.Unmarshal(rm, &raw); err != nil {
				return nil, fmt.Errorf("arguments are not JSON: %w", err)
			}
		}
	}
	switch v := raw.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return v, nil
	default:
		return nil, fmt.Errorf("arguments must be a JSON object, got %s", jsonKind(v))
	}
}

func isJSONNull(b json.RawMessage) bool { return string(bytes.TrimSpace(b)) == "null" }

// jsonKind names the JSON type of a decoded value.
func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64, json.Number, int, int64:
		return "number"
	case []any:
		return "array"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// maxUnknownNamed bounds how many unknown argument names an error lists,
// and maxNameLen how much of each, so a hostile call cannot make the
// error (and the audit line) large.
const (
	maxUnknownNamed = 5
	maxNameLen      = 64
)

// unknownArgs refuses arguments the schema does not declare (every schema
// is strict, checkStrict), naming them and the ones the tool takes.
func unknownArgs(sch *jsonschema.Schema, args map[string]any) error {
	var unknown []string
	for k := range args {
		if !declared(sch, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	named := make([]string, 0, maxUnknownNamed)
	for _, k := range unknown[:min(len(unknown), maxUnknownNamed)] {
		if len(k) > maxNameLen {
			k = k[:maxNameLen] + "..."
		}
		named = append(named, strconv.Quote(k))
	}
	if n := len(unknown) - len(named); n > 0 {
		named = append(named, fmt.Sprintf("and %d more", n))
	}
	known := make([]string, 0, len(sch.Properties))
	for k := range sch.Properties {
		known = append(known, k)
	}
	sort.Strings(known)
	takes := "no arguments"
	if len(known) > 0 {
		takes = "only " + strings.Join(known, ", ")
	}
	word := "argument"
	if len(unknown) > 1 {
		word = "arguments"
	}
	return fmt.Errorf("unknown %s %s: this tool takes %s", word, strings.Join(named, ", "), takes)
}

// declared reports whether the schema names argument k, by name or by one
// of its patternProperties.
func declared(sch *jsonschema.Schema, k string) bool {
	if _, ok := sch.Properties[k]; ok {
		return true
	}
	for re := range sch.PatternProperties {
		if re.MatchString(k) {
			return true
		}
	}
	return false
}

// validateArgs checks arguments against the tool's schema; the message
// lists each failing location so the model can correct its call.
func validateArgs(sch *jsonschema.Schema, args map[string]any) error {
	if args == nil {
		args = map[string]any{}
	}
	if err := unknownArgs(sch, args); err != nil {
		return err
	}
	// Re-decode so numbers are json.Number, as the validator expects.
	b, err := json.Marshal(args)
	if err != nil {
		return fmt.Errorf("arguments are not JSON: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("arguments are not JSON: %w", err)
	}
	if err := sch.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return errors.New(validationMessage(ve))
		}
		return err
	}
	return nil
}

// enPrinter renders validation messages (the validator needs a printer).
var enPrinter = message.NewPrinter(language.English)

func validationMessage(ve *jsonschema.ValidationError) string {
	var parts []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			loc := "/" + strings.Join(e.InstanceLocation, "/")
			if loc == "/" {
				loc = "arguments"
			} else {
				loc = "argument " + strings.TrimPrefix(loc, "/")
			}
			parts = append(parts, loc+": "+e.ErrorKind.LocalizedString(enPrinter))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return strings.Join(parts, "; ")
}

// wrap turns a connector handler into mcp-go's: validation, timeout, panic
// recovery, result conversion, scrubbing and the audit line. It never
// returns a protocol error: every failure is an isError result.
func (s *Server) wrap(conn string, t connector.Tool, sch *jsonschema.Schema) server.ToolHandlerFunc {
	name := t.Def.Name
	return func(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		start := time.Now()
		var (
			res             *mcpgo.CallToolResult
			outcome, errMsg string
		)
		args, err := objectArgs(req.Params.Arguments, req.Params.RawArguments)
		if err != nil {
			errMsg = s.sc.Scrub(fmt.Sprintf("invalid arguments for %s: %v", name, err))
			res, outcome = mcpgo.NewToolResultError(errMsg), "invalid_args"
		} else {
			res, outcome, errMsg = s.call(ctx, name, t, sch, args)
		}
		argJSON, _ := json.Marshal(req.Params.Arguments)
		attrs := []any{"tool", name, "connector", conn, "args", s.sc.Scrub(string(argJSON)),
			"duration_ms", float64(time.Since(start).Microseconds()) / 1000, "outcome", outcome}
		if errMsg != "" {
			attrs = append(attrs, "error", errMsg)
			s.log.Warn("mcp call", attrs...)
		} else {
			s.log.Info("mcp call", attrs...)
		}
		return res, nil
	}
}

type callResult struct {
	v   any
	err error
}

func (s *Server) call(ctx context.Context, name string, t connector.Tool, sch *jsonschema.Schema, args map[string]any) (*mcpgo.CallToolResult, string, string) {
	if err := validateArgs(sch, args); err != nil {
		msg := s.sc.Scrub(fmt.Sprintf("invalid arguments for %s: %v", name, err))
		return mcpgo.NewToolResultError(msg), "invalid_args", msg
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ch := make(chan callResult, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				s.log.Error("mcp tool panicked", "tool", name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				ch <- callResult{err: fmt.Errorf("internal error in %s (a bug in the connector, logged on the server); try another tool", name)}
			}
		}()
		v, err := t.Handler(ctx, connector.Args(args))
		ch <- callResult{v: v, err: err}
	}()
	var r callResult
	select {
	case r = <-ch:
	case <-ctx.Done():
		// The handler ignored its context; leave it to finish on its own.
		r.err = ctx.Err()
	}
	if r.err != nil {
		outcome := "error"
		msg := r.err.Error()
		var ms *connector.MissingSecretError
		switch {
		case errors.As(r.err, &ms):
			outcome = "missing_secret"
		case errors.Is(r.err, context.DeadlineExceeded) && ctx.Err() != nil:
			outcome = "timeout"
			msg = fmt.Sprintf("%s timed out after %s: the system behind it did not answer; try again later or another target", name, s.timeout)
		}
		msg = s.sc.Scrub(msg)
		return mcpgo.NewToolResultError(msg), outcome, msg
	}
	res, err := s.result(r.v)
	if err != nil {
		msg := s.sc.Scrub(fmt.Sprintf("%s returned a result that is not JSON: %v", name, err))
		return mcpgo.NewToolResultError(msg), "error", msg
	}
	return res, "ok", ""
}

// result converts a handler's value: a string is text; anything else is
// indented JSON text plus structured content when it is a JSON object.
// Scrubbing happens on the JSON text and the structured content is decoded
// from the scrubbed text, so both carry the same redactions.
func (s *Server) result(v any) (*mcpgo.CallToolResult, error) {
	if str, ok := v.(string); ok {
		return mcpgo.NewToolResultText(s.sc.Scrub(str)), nil
	}
	// Scrub the decoded strings (keys and values), not only the encoded
	// text, so no JSON escaping of a secret can slip past.
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, err
	}
	generic = s.scrubValue(generic)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(generic); err != nil {
		return nil, err
	}
	res := mcpgo.NewToolResultText(s.sc.Scrub(strings.TrimSuffix(buf.String(), "\n")))
	if obj, ok := generic.(map[string]any); ok {
		res.StructuredContent = obj
	}
	return res, nil
}

// scrubValue scrubs every string and key of a decoded JSON value.
func (s *Server) scrubValue(v any) any {
	switch x := v.(type) {
	case string:
		return s.sc.Scrub(x)
	case []any:
		for i := range x {
			x[i] = s.scrubValue(x[i])
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[s.sc.Scrub(k)] = s.scrubValue(e)
		}
		return out
	default:
		return v
	}
}

// Tools lists the registered tools sorted by name.
func (s *Server) Tools() []ToolInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.tools)
}

// Enabled lists the connectors that serve tools, sorted.
func (s *Server) Enabled() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.enabled)
}

// Disabled maps each connector that was configured but serves nothing to
// the reason (secrets scrubbed), for `gpuhost mcp tools` and the logs.
func (s *Server) Disabled() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]string, len(s.disabled))
	for k, v := range s.disabled {
		out[k] = v
	}
	return out
}

// MCPServer exposes the underlying mcp-go server (for transports this
// package does not wrap).
func (s *Server) MCPServer() *server.MCPServer { return s.mcp }

// Scrub redacts every secret handed out so far from text; front doors that
// show tool output elsewhere (an agent loop, a bot) use it too.
func (s *Server) Scrub(text string) string { return s.sc.Scrub(text) }

// ServeStdio serves MCP over in/out until ctx ends or in closes. Nothing
// but protocol messages goes to out: mcp-go's own errors go to stderr and
// the audit log goes wherever ServerOptions.Log writes (stderr in the CLI).
func (s *Server) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	st := server.NewStdioServer(s.mcp)
	st.SetErrorLogger(log.New(os.Stderr, "mcp: ", log.LstdFlags))
	if err := st.Listen(ctx, in, out); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
		return fmt.Errorf("mcp stdio: %w", err)
	}
	return nil
}

// SessionIdleTTL drops the state of an HTTP session idle this long.
const SessionIdleTTL = time.Hour

// MountPath is where the daemon serves streamable HTTP.
const MountPath = "/mcp"

// HTTPHandler serves streamable HTTP at MountPath. mcp-go's DNS-rebinding
// protection stays on: on a loopback connection, a Host header that is not
// localhost gets 403.
// Sessions are capped at ServerOptions.MaxSessions, the least recently
// used evicted first (see sessionCap). A GET stream is opened only for a
// live session (see getNeedsSession).
func (s *Server) HTTPHandler() http.Handler {
	sc := newSessionCap(s.opts.MaxSessions)
	h := server.NewStreamableHTTPServer(s.mcp,
		server.WithEndpointPath(MountPath),
		server.WithStreamableHTTPLogger(s.log),
		server.WithSessionIdManager(sc),
		// Clients that vanish without DELETE must not leak session state
		// in a daemon that runs for months.
		server.WithSessionIdleTTL(SessionIdleTTL),
		// A GET stream writes now and then, so a peer that is gone or
		// stopped reading is found (http.write_timeout cuts the latter).
		server.WithHeartbeatInterval(StreamHeartbeat),
	)
	sc.mu.Lock()
	sc.drop = dropVia(h)
	sc.mu.Unlock()
	return getNeedsSession(sc, h)
}

// StreamHeartbeat is how often a GET stream carries a ping.
const StreamHeartbeat = 30 * time.Second

// getNeedsSession refuses a GET stream (server-to-client messages of
// protocol revisions before 2026-07-28) without the Mcp-Session-Id of a
// live session: mcp-go opens one for any id, or mints a session for none,
// each a stream that never ends and a session that evicts a real one.
// This server always assigns sessions at initialize, so a client that
// initialized has one; revision 2026-07-28 has no GET stream and mcp-go
// answers it itself.
func getNeedsSession(sc *sessionCap, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) {
			h.ServeHTTP(w, r)
			return
		}
		id := r.Header.Get(server.HeaderKeySessionID)
		if id == "" {
			http.Error(w, "GET "+MountPath+" opens the stream of an initialized session: send its Mcp-Session-Id", http.StatusBadRequest)
			return
		}
		if _, err := sc.Validate(id); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Register mounts HTTPHandler on the daemon's echo server. It inherits
// every middleware registered with e.Use, in particular httpapi.New's
// bearer-token check when the daemon listens beyond loopback.
func (s *Server) Register(e *echo.Echo) {
	e.Any(MountPath, echo.WrapHandler(s.HTTPHandler()))
}

// InProcessClient returns an initialized client talking to s without a
// transport, for tests, `gpuhost mcp test` and an agent loop in the daemon.
// The caller closes it.
func (s *Server) InProcessClient(ctx context.Context) (*client.Client, error) {
	c, err := client.NewInProcessClient(s.mcp)
	if err != nil {
		return nil, fmt.Errorf("mcp in-process client: %w", err)
	}
	if err := c.Start(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("mcp in-process client: start: %w", err)
	}
	req := mcpgo.InitializeRequest{}
	req.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	req.Params.ClientInfo = mcpgo.Implementation{Name: "gpuhost-inprocess", Version: "1"}
	if _, err := c.Initialize(ctx, req); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("mcp in-process client: initialize: %w", err)
	}
	return c, nil
}
