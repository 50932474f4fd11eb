package frontdoor

import "github.com/labstack/echo/v4"

// AuthenticatedKey is the echo context key through which another front door
// vouches for a request before the HTTP API's bearer check: browsers cannot send a
// bearer header (an EventSource cannot set headers at all), so the web panel
// authenticates them with its own cookie sessions. The panel sets the key in
// an e.Pre middleware (which runs before routing and before every e.Use
// middleware) for its own routes, which enforce sessions themselves, and for
// read-only requests that carry a valid session.
const AuthenticatedKey = "gpuhost.authenticated"

// Authenticated reports whether a front door vouched for the request (see
// AuthenticatedKey); the bearer check then lets it through.
func Authenticated(c echo.Context) bool {
	ok, _ := c.Get(AuthenticatedKey).(bool)
	return ok
}
