// Package crmwire is the crm connector's answer as its callers read it: the
// JSON shape of a template tool's result and the length cap on its string
// parameters. It is a leaf of its own so that a reader (the triage worker's
// customer lookup) links neither the connector nor its PostgreSQL driver.
package crmwire

// MaxStringLen caps every string parameter of a crm template tool (schema
// maxLength and a check in the handler): search terms, not documents.
const MaxStringLen = 200

// Result is what a template's tool returns: the rows as column → value
// objects (dates as YYYY-MM-DD, timestamps RFC 3339, numerics as JSON
// numbers), how many, and whether reading stopped at the row cap.
type Result struct {
	Template  string           `json:"template"`
	Columns   []string         `json:"columns"`
	Rows      []map[string]any `json:"rows"`
	RowCount  int              `json:"row_count"`
	Truncated bool             `json:"truncated"`
	MaxRows   int              `json:"max_rows"`
	Note      string           `json:"note,omitempty"`
}
