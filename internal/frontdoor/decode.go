package frontdoor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/jsonlimit"
	"gpuhost/internal/membudget"
)

// readDecodable reads a body on /api or /mcp whole before any handler sees
// it, within the daemon's decode budget, and refuses one the handler could
// not decode within its bounds: over http.max_body_bytes, nested deeper or
// holding more values than the JSON limits (413), or not fitting the
// budget with what decoding it is estimated to allocate (503 +
// Retry-After). Every handler there reads its body whole and decodes it,
// so the budget's reservation is held until the handler returns; done
// gives it back. refused reports that the answer was written.
func (g *Guard) readDecodable(c echo.Context) (done func(), refused bool, err error) {
	r := c.Request()
	budget := g.decode
	body, reserved, rerr := membudget.Read(r.Body, budget, r.ContentLength, g.opts.MaxBodyBytes)
	done = func() { budget.Give(reserved) }
	refuseWith := func(status int, rule, detail string) (func(), bool, error) {
		done()
		c.Response().Header().Set("Connection", "close")
		if status == http.StatusServiceUnavailable {
			c.Response().Header().Set("Retry-After", "1")
		}
		return func() {}, true, refuse(c, status, rule, detail)
	}
	switch {
	case errors.Is(rerr, membudget.ErrOver):
		// The rest of the body is read into nothing first (it costs no
		// memory), so that closing the connection does not reset the
		// answer away while the client is still sending.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, g.opts.MaxBodyBytes+1))
		return refuseWith(http.StatusServiceUnavailable, "decode-memory", decodeBudgetDetail(budget))
	case rerr != nil:
		return refuseWith(http.StatusBadRequest, "body", "reading the request body: "+rerr.Error())
	case int64(len(body)) > g.opts.MaxBodyBytes:
		return refuseWith(http.StatusRequestEntityTooLarge, "body-size",
			fmt.Sprintf("request body is larger than http.max_body_bytes (%d bytes)", g.opts.MaxBodyBytes))
	}
	counts, jerr := jsonlimit.Check(body, g.opts.JSON)
	var le *jsonlimit.Error
	if errors.As(jerr, &le) && le.Kind != "syntax" { // a syntax error is the handler's to explain
		key := map[string]string{"depth": "http.max_json_depth", "values": "http.max_json_values", "strings": "http.max_json_values"}[le.Kind]
		return refuseWith(http.StatusRequestEntityTooLarge, "json-"+le.Kind, fmt.Sprintf("request body refused before decoding: %s; the limit is %s", le.Error(), key))
	}
	extra := counts.DecodeCost()
	if !budget.Take(extra) {
		return refuseWith(http.StatusServiceUnavailable, "decode-memory", decodeBudgetDetail(budget))
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	return func() { budget.Give(reserved + extra) }, false, nil
}

func decodeBudgetDetail(b *membudget.Budget) string {
	return fmt.Sprintf("the daemon is reading and decoding as many request bodies as http.decode_memory_bytes (%d bytes) allows; retry shortly", b.Limit())
}
