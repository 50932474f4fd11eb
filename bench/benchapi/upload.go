package benchapi

import (
	"errors"
	"fmt"
	"gpuhost/bench"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"
)

// MaxUploadBytes bounds a result sent to POST /api/bench/results (the
// daemon's front door bounds every /api body too; a result is tens of KiB).
const MaxUploadBytes = 4 << 20

// handleUpload stores a result a client measured (`gpuhost bench run`
// through the daemon's /v1), so the daemon's list, chart and panel hold
// it. The front door has checked the JSON content type, the body limit
// and, beyond loopback, the bearer token, as for every state-changing
// route.
func (s *Service) handleUpload(c echo.Context) error {
	data, err := io.ReadAll(http.MaxBytesReader(c.Response(), c.Request().Body, MaxUploadBytes))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return c.JSON(http.StatusRequestEntityTooLarge, apiError{Error: "too large", Detail: fmt.Sprintf("a bench result is at most %d bytes", MaxUploadBytes)})
	case err != nil:
		return c.JSON(http.StatusBadRequest, apiError{Error: "bad request", Detail: "read body: " + err.Error()})
	}
	r, err := bench.ParseResult(data)
	if err == nil && !bench.ValidID(r.ID) {
		err = fmt.Errorf("id %q is not a result id (like 20260102T150405Z-coder)", r.ID)
	}
	if err != nil {
		return c.JSON(http.StatusBadRequest, apiError{Error: "bad request", Detail: err.Error()})
	}
	id := r.ID
	if _, err := s.o.Store.Save(r); err != nil {
		return c.JSON(http.StatusInternalServerError, apiError{Error: "cannot store bench result", Detail: err.Error()})
	}
	s.log.Info("bench result uploaded", "id", r.ID, "status", r.Status, "remote", c.RealIP())
	msg := fmt.Sprintf("bench %s: uploaded, %s", id, r.Status)
	if r.ID != id {
		msg += " (stored as " + r.ID + ")"
	}
	s.publish(msg)
	return c.JSON(http.StatusCreated, bench.UploadResponse{ID: r.ID, Result: "/api/bench/" + r.ID})
}
