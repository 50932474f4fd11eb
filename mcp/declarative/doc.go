// Package declarative loads MCP connectors from YAML files, so a new
// read-only HTTP API can be offered to the model without rebuilding
// gpuhost.
//
// Each file in the connectors directory (default
// /etc/gpuhost/connectors.d/*.yaml) is one connector:
//
//	name: attendance                 # tool prefix; [a-z0-9_]+
//	description: Production attendance system
//	base_url: http://attendance.internal:8080/api
//	auth:                            # optional; exactly one of header / query
//	  header: {name: Authorization, env: ATTENDANCE_TOKEN, prefix: "Bearer "}
//	  # query: {name: api_key, env: ATTENDANCE_KEY}
//	timeout: 10s                     # per call; default 10s, at most 60s
//	tools:
//	  - name: absences               # tool attendance_absences
//	    description: Who is absent between two dates.
//	    method: GET                  # optional; only GET is accepted
//	    path: /v1/absences           # {param} placeholders for path params
//	    params:
//	      - {name: from, in: query, type: date, required: true}
//	      - {name: department, in: query, type: enum, values: [assembly, paint]}
//	    select: /data/items          # optional RFC 6901 JSON pointer
//
// The same rules hold as for compiled connectors (docs/design.md decisions 1
// and 2), and this package enforces them before the registry sees a tool:
//
//   - Parsing is strict: an unknown key is an error naming the file and the
//     key path (tools[0].params[1].foo), as is a path placeholder without a
//     declared path parameter, a base_url that is not absolute http(s), a
//     method other than GET or a name outside [a-z0-9_]+.
//   - The model never writes a URL: it fills typed parameters only. Path
//     values are path-escaped (a "/" cannot add a segment, "." and ".." are
//     refused), query values are URL-encoded, dates must be YYYY-MM-DD,
//     enums become JSON Schema enums and are checked again at call time.
//   - The secret is read with env.Secrets.Get at every call (a missing one is
//     a *connector.MissingSecretError naming the variable) and never appears in a
//     result or error: error excerpts, transport errors (which would carry a
//     query-string key) and even response bodies that echo it are scrubbed
//     here, before the registry scrubs again. Redirects are not followed, so
//     an auth header never travels to another host.
//   - Responses must be JSON; HTML login pages, other content types, HTTP
//     errors and timeouts become errors naming the connector, the tool and
//     the status, with a short body excerpt the model can act on.
//
// Load reads a directory (one broken file does not stop the others) and
// Watch calls a reload function on SIGHUP; the daemon wires both into the
// MCP registry.
package declarative
