package triage

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"
)

// APIResponse is the body of GET /api/triage.
type APIResponse struct {
	State   Status   `json:"state"`
	Results []Result `json:"results"`
}

// Register mounts GET /api/triage on the daemon's API: the poll and
// checkpoint state and the recent results, newest first (?limit=N). It
// carries no mail body, transcript or secret; the API's bearer token guards
// it like every other route.
func (w *Worker) Register(e *echo.Echo) {
	e.GET("/api/triage", w.handleGet)
}

func (w *Worker) handleGet(c echo.Context) error {
	rs := w.Recent()
	limit := len(rs)
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return c.JSON(http.StatusBadRequest, map[string]string{
				"error": "bad request", "detail": "limit must be a non-negative integer, not " + strconv.Quote(v),
			})
		}
		limit = min(n, limit)
	}
	out := make([]Result, 0, limit)
	for i := len(rs) - 1; i >= 0 && len(out) < limit; i-- {
		out = append(out, rs[i])
	}
	return c.JSON(http.StatusOK, APIResponse{State: w.State(), Results: out})
}
