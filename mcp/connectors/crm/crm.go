package crm

import (
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"gpuhost/mcp/connectors/crm/crmwire"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

func init() {
	connector.Register("crm", func() connector.Connector { return &builder{} })
}

// Defaults and limits. The caps keep a single call cheap for the database
// and small enough for a model's context.
const (
	DefaultStatementTimeout = 5 * time.Second
	DefaultMaxRows          = 200
	// MaxStringLen caps every string parameter (see crmwire).
	MaxStringLen = crmwire.MaxStringLen
	// maxRowsLimit and maxTimeout bound what config may ask for.
	maxRowsLimit = 10000
	maxTimeout   = 5 * time.Minute
)

// Param types a template parameter may have.
const (
	TypeString = "string"
	TypeInt    = "int"
	TypeDate   = "date"
)

// Config is the `mcp.connectors.crm` section.
type Config struct {
	// DSNEnv names the environment variable holding the PostgreSQL DSN of
	// the read-only role; read at every call, never logged or returned.
	DSNEnv string `yaml:"dsn_env"`
	// StatementTimeout is applied with SET LOCAL to every query (default 5s).
	StatementTimeout time.Duration `yaml:"statement_timeout"`
	// MaxRows stops reading after this many rows and marks the result
	// truncated (default 200).
	MaxRows int `yaml:"max_rows"`
	// Templates are the named queries; omitted means DefaultTemplates.
	Templates []Template `yaml:"templates"`
}

// Template is one named, parameterised query. The model only ever fills
// Params; the SQL comes from the operator's config.
type Template struct {
	Name        string  `yaml:"name"`
	Description string  `yaml:"description"`
	SQL         string  `yaml:"sql"`
	Params      []Param `yaml:"params"`
}

// Param is a template parameter, bound as $N in the order listed.
type Param struct {
	Name        string `yaml:"name"`
	Type        string `yaml:"type"` // string | int | date
	Description string `yaml:"description"`
	Required    bool   `yaml:"required"`
}

// DefaultTemplates are used when the config lists none. They assume the
// schema shown in doc.go (users, projects, invoices, tickets); optional
// parameters are NULL when omitted, which the SQL treats as "any".
func DefaultTemplates() []Template {
	return []Template{
		{
			Name:        "search_users",
			Description: "Find CRM users (customers) whose name, email or company contains the text.",
			SQL: `SELECT id, name, email, company, created_at
FROM users
WHERE name ILIKE '%' || $1 || '%' OR email ILIKE '%' || $1 || '%' OR company ILIKE '%' || $1 || '%'
ORDER BY name, id`,
			Params: []Param{{Name: "query", Type: TypeString, Description: "Text to look for in name, email or company.", Required: true}},
		},
		{
			Name:        "search_projects",
			Description: "Find projects whose name or description contains the text, with their customer.",
			SQL: `SELECT p.id, p.name, p.status, p.started_on, u.id AS customer_id, u.name AS customer
FROM projects p JOIN users u ON u.id = p.customer_id
WHERE p.name ILIKE '%' || $1 || '%' OR p.description ILIKE '%' || $1 || '%'
ORDER BY p.started_on DESC, p.id`,
			Params: []Param{{Name: "query", Type: TypeString, Description: "Text to look for in project name or description.", Required: true}},
		},
		{
			Name:        "search_invoices",
			Description: "List invoices, optionally only one customer's and/or only one status (open, paid, overdue).",
			SQL: `SELECT i.id, i.number, i.customer_id, u.name AS customer, i.amount, i.currency, i.status, i.issued_on, i.due_on
FROM invoices i JOIN users u ON u.id = i.customer_id
WHERE ($1::bigint IS NULL OR i.customer_id = $1) AND ($2::text IS NULL OR i.status = $2)
ORDER BY i.issued_on DESC, i.id`,
			Params: []Param{
				{Name: "customer_id", Type: TypeInt, Description: "Only invoices of this customer (user id)."},
				{Name: "status", Type: TypeString, Description: "Only invoices with this status: open, paid or overdue."},
			},
		},
		{
			Name:        "customer_history",
			Description: "The full history of one customer for a support request: projects, invoices and tickets, newest first.",
			SQL: `SELECT * FROM (
  SELECT 'project' AS kind, p.id, p.started_on AS day, p.name AS title, p.status FROM projects p WHERE p.customer_id = $1
  UNION ALL
  SELECT 'invoice', i.id, i.issued_on, i.number || ' ' || i.amount::text || ' ' || i.currency, i.status FROM invoices i WHERE i.customer_id = $1
  UNION ALL
  SELECT 'ticket', t.id, t.opened_on, t.subject, t.status FROM tickets t WHERE t.customer_id = $1
) h ORDER BY day DESC, kind, id`,
			Params: []Param{{Name: "user_id", Type: TypeInt, Description: "The customer's user id (see crm_search_users).", Required: true}},
		},
	}
}

var (
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9_]{0,47}$`)
	envRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	dollarRE = regexp.MustCompile(`\$([0-9]+)`)
)

// connector implements connector.Connector for the CRM database.
type builder struct{}

// Build validates the config and returns one tool per template.
func (c *builder) Build(env connector.Env) ([]connector.Tool, error) {
	var cfg Config
	if err := connector.DecodeConfig(env, &cfg); err != nil {
		return nil, err
	}
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("mcp.connectors.%s: %w", env.Name, err)
	}
	if env.Secrets == nil {
		return nil, fmt.Errorf("mcp.connectors.%s: no secrets accessor in the environment", env.Name)
	}
	log := env.Logger()
	db := &database{secrets: env.Secrets, dsnEnv: cfg.DSNEnv, timeout: cfg.StatementTimeout, maxRows: cfg.MaxRows, log: log}
	tools := make([]connector.Tool, 0, len(cfg.Templates))
	for _, tpl := range cfg.Templates {
		tools = append(tools, connector.Tool{Def: toolDef(tpl, cfg), Handler: db.handler(tpl)})
	}
	return tools, nil
}

// normalize fills defaults and rejects a config that could not work, with
// the offending key named, at start rather than at the first call.
func (cfg *Config) normalize() error {
	if cfg.DSNEnv == "" {
		return errors.New("dsn_env is required: name the environment variable that holds the read-only role's DSN")
	}
	if !envRE.MatchString(cfg.DSNEnv) {
		return fmt.Errorf("dsn_env %q is not an environment variable name (put the DSN in the environment, not in the config)", cfg.DSNEnv)
	}
	switch {
	case cfg.StatementTimeout == 0:
		cfg.StatementTimeout = DefaultStatementTimeout
	case cfg.StatementTimeout < time.Millisecond || cfg.StatementTimeout > maxTimeout:
		return fmt.Errorf("statement_timeout %s is outside 1ms..%s", cfg.StatementTimeout, maxTimeout)
	}
	switch {
	case cfg.MaxRows == 0:
		cfg.MaxRows = DefaultMaxRows
	case cfg.MaxRows < 1 || cfg.MaxRows > maxRowsLimit:
		return fmt.Errorf("max_rows %d is outside 1..%d", cfg.MaxRows, maxRowsLimit)
	}
	if cfg.Templates == nil {
		cfg.Templates = DefaultTemplates()
	}
	if len(cfg.Templates) == 0 {
		return errors.New("templates is empty: configure at least one query template (or omit the key for the defaults)")
	}
	seen := map[string]bool{}
	for i := range cfg.Templates {
		if err := cfg.Templates[i].validate(); err != nil {
			return fmt.Errorf("templates[%d]: %w", i, err)
		}
		if seen[cfg.Templates[i].Name] {
			return fmt.Errorf("templates[%d]: duplicate name %q", i, cfg.Templates[i].Name)
		}
		seen[cfg.Templates[i].Name] = true
	}
	return nil
}

// validate checks one template: a tool-safe name, SQL, typed params, and
// that the SQL's $N placeholders are exactly $1..$len(params), so a
// parameter can never be silently ignored or left unbound.
func (t *Template) validate() error {
	if !nameRE.MatchString(t.Name) {
		return fmt.Errorf("name %q must be lower-case letters, digits and _ (starting with a letter, at most 48)", t.Name)
	}
	if strings.TrimSpace(t.SQL) == "" {
		return fmt.Errorf("template %q: sql is empty", t.Name)
	}
	if strings.TrimSpace(t.Description) == "" {
		return fmt.Errorf("template %q: description is empty (the model chooses tools by it)", t.Name)
	}
	names := map[string]bool{}
	for j, p := range t.Params {
		if !nameRE.MatchString(p.Name) {
			return fmt.Errorf("template %q: params[%d]: name %q must be lower-case letters, digits and _", t.Name, j, p.Name)
		}
		if names[p.Name] {
			return fmt.Errorf("template %q: params[%d]: duplicate name %q", t.Name, j, p.Name)
		}
		names[p.Name] = true
		switch p.Type {
		case TypeString, TypeInt, TypeDate:
		default:
			return fmt.Errorf("template %q: param %q: type %q must be string, int or date", t.Name, p.Name, p.Type)
		}
	}
	used := Placeholders(t.SQL)
	for n := 1; n <= len(t.Params); n++ {
		if !used[n] {
			return fmt.Errorf("template %q: param %q is never used: the sql has no $%d", t.Name, t.Params[n-1].Name, n)
		}
	}
	for n := range used {
		if n < 1 || n > len(t.Params) {
			return fmt.Errorf("template %q: the sql uses $%d but only %d params are declared", t.Name, n, len(t.Params))
		}
	}
	return nil
}

// Placeholders returns the set of $N numbers in sql. It is deliberately
// simple (a $N inside a string literal counts too): it exists to catch
// config mistakes, while PostgreSQL itself decides what gets bound.
func Placeholders(sql string) map[int]bool {
	out := map[int]bool{}
	for _, m := range dollarRE.FindAllStringSubmatch(sql, -1) {
		n, err := strconv.Atoi(m[1])
		if err != nil || n > math.MaxInt32 {
			n = -1 // absurdly large: reported as out of range
		}
		out[n] = true
	}
	return out
}

// toolDef builds the MCP definition of one template's tool: typed, capped
// properties and the read-only annotations the registry insists on.
func toolDef(tpl Template, cfg Config) mcpgo.Tool {
	desc := fmt.Sprintf("%s (CRM, read-only; at most %d rows, stops after %s; the result says \"truncated\" when more rows matched)",
		strings.TrimSpace(tpl.Description), cfg.MaxRows, cfg.StatementTimeout)
	opts := []mcpgo.ToolOption{
		mcpgo.WithDescription(desc),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithIdempotentHintAnnotation(true),
		mcpgo.WithOpenWorldHintAnnotation(false),
		mcpgo.WithSchemaAdditionalProperties(false),
	}
	for _, p := range tpl.Params {
		po := []mcpgo.PropertyOption{}
		if p.Description != "" {
			po = append(po, mcpgo.Description(p.Description))
		}
		if p.Required {
			po = append(po, mcpgo.Required())
		}
		switch p.Type {
		case TypeString:
			po = append(po, mcpgo.MaxLength(MaxStringLen))
			opts = append(opts, mcpgo.WithString(p.Name, po...))
		case TypeInt:
			po = append(po, mcpgo.Min(float64(-(1 << 53))), mcpgo.Max(float64(1<<53)))
			opts = append(opts, mcpgo.WithInteger(p.Name, po...))
		case TypeDate:
			po = append(po, mcpgo.Pattern(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`), mcpgo.MaxLength(10))
			opts = append(opts, mcpgo.WithString(p.Name, po...))
		}
	}
	return mcpgo.NewTool("crm_"+tpl.Name, opts...)
}

// BindArgs converts a call's arguments to the values bound as $1..$N, in
// the template's parameter order. Values are only ever bound, never
// spliced into SQL; a missing optional parameter binds NULL.
func BindArgs(tpl Template, args connector.Args) ([]any, error) {
	out := make([]any, len(tpl.Params))
	for i, p := range tpl.Params {
		raw, present := args[p.Name]
		if !present || raw == nil {
			if p.Required {
				return nil, fmt.Errorf("parameter %q is required (%s)", p.Name, p.Type)
			}
			continue
		}
		v, err := convert(p, raw)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	for k := range args {
		if !hasParam(tpl, k) {
			return nil, fmt.Errorf("unknown parameter %q; this tool takes: %s", k, paramList(tpl))
		}
	}
	return out, nil
}

func hasParam(tpl Template, name string) bool {
	for _, p := range tpl.Params {
		if p.Name == name {
			return true
		}
	}
	return false
}

func paramList(tpl Template) string {
	if len(tpl.Params) == 0 {
		return "no parameters"
	}
	s := make([]string, len(tpl.Params))
	for i, p := range tpl.Params {
		s[i] = p.Name + " (" + p.Type + ")"
	}
	return strings.Join(s, ", ")
}

func convert(p Param, raw any) (any, error) {
	switch p.Type {
	case TypeString:
		s, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("parameter %q must be a string, got %T", p.Name, raw)
		}
		if len([]rune(s)) > MaxStringLen {
			return nil, fmt.Errorf("parameter %q is longer than %d characters", p.Name, MaxStringLen)
		}
		if strings.ContainsRune(s, 0) {
			return nil, fmt.Errorf("parameter %q contains a NUL character, which PostgreSQL text cannot hold", p.Name)
		}
		return s, nil
	case TypeInt:
		var f float64
		switch v := raw.(type) {
		case float64:
			f = v
		case int:
			return int64(v), nil
		case int64:
			return v, nil
		default:
			return nil, fmt.Errorf("parameter %q must be an integer, got %T", p.Name, raw)
		}
		if f != math.Trunc(f) || math.IsInf(f, 0) || math.IsNaN(f) || f < -(1<<53) || f > 1<<53 {
			return nil, fmt.Errorf("parameter %q must be a whole number, got %v", p.Name, f)
		}
		return int64(f), nil
	case TypeDate:
		s, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("parameter %q must be a date string YYYY-MM-DD, got %T", p.Name, raw)
		}
		d, err := time.Parse("2006-01-02", s)
		if err != nil {
			return nil, fmt.Errorf("parameter %q must be a date YYYY-MM-DD, got %q", p.Name, truncate(s, 40))
		}
		return d, nil
	}
	return nil, fmt.Errorf("parameter %q has unsupported type %q", p.Name, p.Type)
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
