// Package connector is the contract between gpuhost's MCP server and its
// connectors, kept apart from the server so that a connector links only
// what it implements: not the MCP server, its HTTP stack or the CLI, and
// not the daemon's GPU and bench packages (a connector that reads the
// daemon names the few methods it needs itself). Connectors register at
// init (like database/sql drivers); package gpuhost/mcp builds them and
// enforces the rules that hold for all of them (docs/design.md
// decisions 1 and 2): tools only read, targets are enumerated from config,
// secrets are read at call time and scrubbed from everything that leaves,
// failures are isError results the model can act on.
package connector

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"gopkg.in/yaml.v3"
)

// Connector turns its config section into tools. Build is called once at
// start (and again on SIGHUP for declarative connectors); an error disables
// the connector with that message and the others carry on.
type Connector interface {
	// Build returns the connector's tools. env.Config is its section
	// (`mcp.connectors.<name>`), decoded by the connector with unknown keys
	// rejected (DecodeConfig does that and names the key path).
	Build(env Env) ([]Tool, error)
}

// Named is a connector that is not in the init-time registry: declarative
// connectors read from connectors_dir are built by their own package and
// handed to the server under their file's name.
type Named struct {
	Name      string
	Connector Connector
}

// Redacted replaces every secret value in text that leaves the server; a
// connector that scrubs its own messages (before the server's scrubbing
// sees them) uses the same marker, so the model meets one form.
const Redacted = "[redacted]"

// Factory makes a connector; registered under a name at init.
type Factory func() Connector

var (
	regMu     sync.Mutex
	factories = map[string]Factory{}
)

// Register adds a connector factory; it panics on a duplicate name, which
// is a programming error found by the first test run (init time).
func Register(name string, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := factories[name]; dup {
		panic("connector: registered twice: " + name)
	}
	factories[name] = f
}

// Registered lists the registered connector names, sorted.
func Registered() []string {
	regMu.Lock()
	defer regMu.Unlock()
	out := make([]string, 0, len(factories))
	for n := range factories {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Factories returns a copy of the registered factories.
func Factories() map[string]Factory {
	regMu.Lock()
	defer regMu.Unlock()
	out := make(map[string]Factory, len(factories))
	for n, f := range factories {
		out[n] = f
	}
	return out
}

// Tool is one read-only tool: its MCP definition and the handler. The
// registry refuses a Def without ReadOnlyHint true and DestructiveHint
// false, or whose input schema is not strict (additionalProperties false
// on every object: mcpgo.WithSchemaAdditionalProperties(false)), wraps Handler with secret scrubbing, audit logging and error
// conversion, and validates arguments against Def's input schema.
type Tool struct {
	Def mcpgo.Tool
	// Handler returns a JSON-able result (a string is sent as text, other
	// values as indented JSON text plus structured content). An error
	// becomes an isError result with its message (scrubbed).
	Handler func(ctx context.Context, args Args) (any, error)
	// Targets, when set, names the argument that selects a configured
	// target and its allowed values; the registry checks the schema has
	// exactly that enum and `gpuhost mcp test` calls the tool once per
	// target with TestArgs.
	Targets *Targets
}

// Targets describes an enumerated target parameter.
type Targets struct {
	Param  string
	Values []string
	// TestArgs returns the arguments for a stand-alone check of one target
	// (nil: only the target parameter).
	TestArgs func(target string) map[string]any
}

// Args are a call's arguments, already validated against the schema (no
// argument the schema does not declare).
type Args map[string]any

// String returns a string argument or "".
func (a Args) String(name string) string { s, _ := a[name].(string); return s }

// Number returns a numeric argument (JSON numbers decode as float64).
func (a Args) Number(name string) (float64, bool) { f, ok := a[name].(float64); return f, ok }

// Env is what a connector gets to build its tools.
type Env struct {
	Name    string
	Config  yaml.Node // the connector's section; zero Kind when absent
	Secrets *Secrets
	HTTP    *http.Client // timeouts set; use with request contexts
	Log     *slog.Logger
	// Daemon is the running daemon, nil outside it (e.g. `gpuhost mcp`
	// without one). It is untyped so that the contract does not link the
	// daemon's packages into every connector: a connector that reads the
	// daemon asserts the small interface it defines itself (only reads:
	// the daemon offers no switch or stop) and disables itself with a
	// message when Daemon is nil or lacks it.
	Daemon any
}

// DecodeConfig decodes a connector's section into v with unknown keys
// rejected; errors name the key path under mcp.connectors.<name>.
func DecodeConfig(env Env, v any) error {
	if env.Config.Kind == 0 {
		return nil
	}
	if err := decodeStrict(&env.Config, v); err != nil {
		return fmt.Errorf("mcp.connectors.%s: %w", env.Name, err)
	}
	return nil
}

// Secrets reads named secrets from the environment (or files) at call
// time, never caching them in tool results, and remembers every value it
// handed out so the registry can scrub it from results, errors and logs.
type Secrets struct {
	mu     sync.Mutex
	lookup func(name string) (string, bool)
	seen   map[string]struct{}
}

// NewSecrets reads from lookup (os.LookupEnv in production).
func NewSecrets(lookup func(string) (string, bool)) *Secrets {
	return &Secrets{lookup: lookup, seen: map[string]struct{}{}}
}

// MissingSecretError names the variable a call needed; the registry turns
// it into an isError result.
type MissingSecretError struct{ Name string }

func (e *MissingSecretError) Error() string {
	return fmt.Sprintf("secret %s is not set: set the environment variable %s for gpuhost (it is never read from the prompt)", e.Name, e.Name)
}

// Get returns the secret or a *MissingSecretError; never a default.
func (s *Secrets) Get(name string) (string, error) {
	v, ok := s.lookup(name)
	if !ok || v == "" {
		return "", &MissingSecretError{Name: name}
	}
	s.mu.Lock()
	s.seen[v] = struct{}{}
	s.mu.Unlock()
	return v, nil
}

// Values returns every secret value handed out so far (for scrubbing).
func (s *Secrets) Values() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.seen))
	for v := range s.seen {
		out = append(out, v)
	}
	return out
}

// Mark records a secret value that did not come through Get (for example
// one read from a declarative connector's file), so it is scrubbed too.
func (s *Secrets) Mark(v string) {
	if v == "" {
		return
	}
	s.mu.Lock()
	s.seen[v] = struct{}{}
	s.mu.Unlock()
}

// Logger is env.Log, or a discarding logger when none was given, so
// connectors can log unconditionally.
func (e Env) Logger() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// Client is env.HTTP, or a client with the connector's own timeout when
// none was given (tests, `gpuhost mcp tools`).
func (e Env) Client(timeout time.Duration) *http.Client {
	if e.HTTP == nil {
		return &http.Client{Timeout: timeout}
	}
	return e.HTTP
}
