// Package crm is the `crm` MCP connector: read-only access to the CRM's
// PostgreSQL database through named, parameterised query templates from
// the config. The model picks a template (one tool per template, named
// crm_<name>) and fills its typed parameters; it never writes SQL, and
// parameter values are always bound ($1, $2, …), never spliced into the
// query text, so `'; DROP TABLE users; --` is just a search string.
//
// Two independent layers keep it read-only (docs/design.md decision 1):
//
//  1. every template runs inside BEGIN READ ONLY with SET LOCAL
//     statement_timeout, and reading stops after max_rows rows (the result
//     then says truncated);
//  2. the DSN logs in as a role that only has SELECT grants and defaults
//     to read-only transactions: scripts/crm-readonly-role.sql creates it
//     (gpuhost_crm_ro). A careless template such as `DELETE FROM users`
//     is refused by the transaction, and would be refused by the role's
//     missing privileges even if the transaction were not read-only.
//
// The DSN is read from the environment variable named by dsn_env at every
// call (a missing one is a *connector.MissingSecretError naming it); its password
// never appears in results, errors or logs. Each call opens its own
// connection, so nothing is cached between calls.
//
// Config section (gpuhost.yaml); omit `templates` to get DefaultTemplates,
// which are exactly the four below:
//
//	mcp:
//	  connectors:
//	    crm:
//	      dsn_env: GPUHOST_CRM_DSN    # e.g. postgres://gpuhost_crm_ro:…@db:5432/crm
//	      statement_timeout: 5s       # default 5s
//	      max_rows: 200               # default 200
//	      templates:
//	        - name: search_users
//	          description: Find CRM users (customers) whose name, email or company contains the text.
//	          sql: |
//	            SELECT id, name, email, company, created_at FROM users
//	            WHERE name ILIKE '%' || $1 || '%' OR email ILIKE '%' || $1 || '%'
//	               OR company ILIKE '%' || $1 || '%'
//	            ORDER BY name, id
//	          params:
//	            - {name: query, type: string, required: true, description: Text to look for.}
//	        - name: search_projects
//	          description: Find projects whose name or description contains the text.
//	          sql: |
//	            SELECT p.id, p.name, p.status, p.started_on, u.id AS customer_id, u.name AS customer
//	            FROM projects p JOIN users u ON u.id = p.customer_id
//	            WHERE p.name ILIKE '%' || $1 || '%' OR p.description ILIKE '%' || $1 || '%'
//	            ORDER BY p.started_on DESC, p.id
//	          params:
//	            - {name: query, type: string, required: true}
//	        - name: search_invoices
//	          description: List invoices, optionally of one customer and/or one status.
//	          sql: |
//	            SELECT i.id, i.number, i.customer_id, u.name AS customer, i.amount, i.currency,
//	                   i.status, i.issued_on, i.due_on
//	            FROM invoices i JOIN users u ON u.id = i.customer_id
//	            WHERE ($1::bigint IS NULL OR i.customer_id = $1) AND ($2::text IS NULL OR i.status = $2)
//	            ORDER BY i.issued_on DESC, i.id
//	          params:
//	            - {name: customer_id, type: int}     # optional: NULL when omitted
//	            - {name: status, type: string}
//	        - name: customer_history
//	          description: The full history of one customer (projects, invoices, tickets).
//	          sql: |
//	            SELECT * FROM (
//	              SELECT 'project' AS kind, id, started_on AS day, name AS title, status FROM projects WHERE customer_id = $1
//	              UNION ALL SELECT 'invoice', id, issued_on, number, status FROM invoices WHERE customer_id = $1
//	              UNION ALL SELECT 'ticket', id, opened_on, subject, status FROM tickets WHERE customer_id = $1
//	            ) h ORDER BY day DESC, kind, id
//	          params:
//	            - {name: user_id, type: int, required: true}
//
// Parameter types: string (length-capped at MaxStringLen), int (whole
// numbers), date (YYYY-MM-DD, bound as a date). Each parameter is $N in the
// order listed; Build rejects a template whose SQL does not use exactly
// $1..$N. The default templates assume this schema:
//
//	users(id bigint, name text, email text, company text, created_at timestamptz)
//	projects(id bigint, customer_id bigint → users, name text, description text, status text, started_on date)
//	invoices(id bigint, number text, customer_id bigint → users, amount numeric, currency text,
//	         status text, issued_on date, due_on date)
//	tickets(id bigint, customer_id bigint → users, subject text, status text, opened_on date)
package crm
