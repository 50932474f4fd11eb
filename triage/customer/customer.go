// Package customer tells the triage worker whether an external sender is a
// known customer. It asks the CRM through the MCP crm connector's
// read-only search template (docs/design.md decision 1: rights live in the
// server), exactly as a model would, so triage needs no database
// credentials and no SQL of its own: the DSN stays inside the connector.
package customer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"gpuhost/mcp/connectors/crm/crmwire"
)

// Defaults of Lookup.
const (
	// DefaultTool is the crm connector's default user search template.
	DefaultTool = "crm_search_users"
	// DefaultTimeout bounds one lookup: the connector's own connect and
	// statement timeouts plus headroom.
	DefaultTimeout = 30 * time.Second
	// IDPlaceholder in ProfileURL is replaced by the customer's id.
	IDPlaceholder = "{id}"
)

// Caller is the part of an MCP client Lookup needs; mcp-go's
// *client.Client (for example from (*mcp.Server).InProcessClient)
// satisfies it.
type Caller interface {
	CallTool(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error)
}

// Customer is a CRM user whose email is exactly the sender's.
type Customer struct {
	ID      int64  `json:"id"`
	Name    string `json:"name,omitempty"`
	Email   string `json:"email"`
	Company string `json:"company,omitempty"`
	URL     string `json:"url,omitempty"` // ProfileURL with the id filled in
}

// Lookup finds customers by email through an MCP crm search tool.
type Lookup struct {
	Client Caller
	// Tool is the search template's tool (default DefaultTool). It takes
	// one string argument "query" and returns rows with at least the
	// columns id and email (name and company are used when present).
	Tool string
	// ProfileURL links to the customer in the CRM's UI, with {id} where
	// the id goes (e.g. https://crm.example.com/users/{id}); empty: no link.
	ProfileURL string
	// Timeout bounds one lookup (default DefaultTimeout).
	Timeout time.Duration
	// Match says how Tool's SQL uses the query: MatchLike (the default, as
	// crm_search_users: ILIKE '%' || $1 || '%') gets the address with the
	// LIKE wildcards %, _ and the escape \ escaped, so it is matched
	// literally; MatchEqual (a template comparing with =) gets it as is.
	Match string
}

// Match kinds of Lookup.Match.
const (
	MatchLike  = "like"
	MatchEqual = "equal"
)

// likeEscaper makes an address literal inside a LIKE/ILIKE pattern with
// PostgreSQL's default escape character (backslash).
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// Find returns the customer whose email is exactly email (ignoring case),
// or nil, nil when there is none. The search template matches substrings,
// so rows are filtered here: ann@example.com must not find
// joann@example.com. A tool error (database down, DSN missing) is an error
// carrying the tool's message, never a silent "not a customer".
func (l *Lookup) Find(ctx context.Context, email string) (*Customer, error) {
	if l == nil || l.Client == nil {
		return nil, errors.New("customer lookup: no MCP client configured")
	}
	want := strings.ToLower(strings.TrimSpace(email))
	tool := l.Tool
	if tool == "" {
		tool = DefaultTool
	}
	if want == "" || !strings.Contains(want, "@") {
		return nil, fmt.Errorf("customer lookup via %s: %q is not an email address", tool, email)
	}
	var query string
	switch l.Match {
	case "", MatchLike:
		// A sender's "%@%" must not turn the lookup into a scan of other
		// customers (nor "_" into a one-character wildcard).
		query = likeEscaper.Replace(want)
	case MatchEqual:
		query = want
	default:
		return nil, fmt.Errorf("customer lookup via %s: match %q is neither %q nor %q", tool, l.Match, MatchLike, MatchEqual)
	}
	if len(query) > crmwire.MaxStringLen {
		return nil, fmt.Errorf("customer lookup via %s: email address of %d bytes is longer than the %d the CRM search accepts", tool, len(query), crmwire.MaxStringLen)
	}
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	req := mcpgo.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = map[string]any{"query": query}
	res, err := l.Client.CallTool(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("customer lookup via %s for %s: %w", tool, want, err)
	}
	if res == nil {
		return nil, fmt.Errorf("customer lookup via %s for %s: empty tool result", tool, want)
	}
	text := resultText(res)
	if res.IsError {
		if text == "" {
			text = "the tool reported an error without a message"
		}
		return nil, fmt.Errorf("customer lookup via %s for %s: %s", tool, want, text)
	}
	c, err := pickExact(text, want, l.Match == MatchEqual)
	if err != nil {
		return nil, fmt.Errorf("customer lookup via %s for %s: %w", tool, want, err)
	}
	if c != nil && l.ProfileURL != "" {
		c.URL = strings.ReplaceAll(l.ProfileURL, IDPlaceholder, strconv.FormatInt(c.ID, 10))
	}
	return c, nil
}

// resultText joins the text contents of a tool result.
func resultText(res *mcpgo.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(mcpgo.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// pickExact decodes a crmwire.Result (the JSON text of a template tool) and
// returns the first row whose email equals want, ignoring case and
// surrounding spaces. A truncated result without an exact match is an
// error: the match may be among the rows not returned. equal says the
// template compares with = (so many rows for one address are duplicates),
// otherwise it matches the (escaped) address as a substring.
func pickExact(text, want string, equal bool) (*Customer, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var res crmwire.Result
	if err := dec.Decode(&res); err != nil {
		return nil, fmt.Errorf("the tool result is not a CRM result (JSON): %w", err)
	}
	if res.Rows == nil {
		return nil, errors.New("the tool result has no rows field: not a CRM template result")
	}
	for i, row := range res.Rows {
		email, _ := row["email"].(string)
		if _, ok := row["email"]; !ok {
			return nil, fmt.Errorf("row %d has no email column (columns %v): the template must select email", i+1, res.Columns)
		}
		if !strings.EqualFold(strings.TrimSpace(email), want) {
			continue
		}
		id, err := rowID(row["id"])
		if err != nil {
			return nil, fmt.Errorf("row %d: %w", i+1, err)
		}
		name, _ := row["name"].(string)
		company, _ := row["company"].(string)
		return &Customer{ID: id, Name: name, Email: strings.TrimSpace(email), Company: company}, nil
	}
	if res.Truncated {
		if equal {
			return nil, fmt.Errorf("the search stopped at %d rows (the connector's max_rows) without one whose email is exactly the address, so the customer may be among the rest: the template (triage.crm.match: equal) returns rows that do not equal the address; make it compare the email column with =", res.RowCount)
		}
		return nil, fmt.Errorf("the search stopped at %d rows (the connector's max_rows) without an exact match, so the customer may be among the rest: the template matches the address as a substring of name, email or company, and more than %d CRM rows contain it; use an exact-match template for the lookup (triage.crm.tool naming a template with lower(email) = lower($1), and triage.crm.match: equal)", res.RowCount, res.RowCount)
	}
	return nil, nil
}

// rowID reads the id column: a JSON integer (or a string of digits).
func rowID(v any) (int64, error) {
	var s string
	switch x := v.(type) {
	case json.Number:
		s = x.String()
	case string:
		s = x
	case nil:
		return 0, errors.New("no id column: the template must select id")
	default:
		return 0, fmt.Errorf("id %v is %T, want an integer", v, v)
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("id %q is not an integer: %w", s, err)
	}
	return id, nil
}
