package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/spf13/cobra"

	"gpuhost/api"
)

// MaxUploadBytes bounds a result sent to POST /api/bench/results (the
// daemon's front door bounds every /api body too; a result is tens of KiB).
const MaxUploadBytes = 4 << 20

// UploadResponse is the answer of POST /api/bench/results: the ID the
// daemon stored the result under (a collision suffix may have been added)
// and where it is served.
type UploadResponse struct {
	ID     string `json:"id"`
	Result string `json:"result"`
}

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
	r, err := ParseResult(data)
	if err == nil && !ValidID(r.ID) {
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
	return c.JSON(http.StatusCreated, UploadResponse{ID: r.ID, Result: "/api/bench/" + r.ID})
}

// daemonStore returns the daemon's client when this run's result belongs
// in the daemon's store: the target is the daemon's /v1 (no --url), or
// --url names a gpuhost daemon. nil (store locally) for --dir, a plain
// endpoint (a bare vLLM or Ollama), or no way to reach the daemon.
func (rf *runFlags) daemonStore(ctx context.Context, cmd *cobra.Command, deps Deps) *api.Client {
	if dir, _ := cmd.Flags().GetString("dir"); dir != "" || deps.Daemon == nil {
		return nil
	}
	base := ""
	if rf.url != "" {
		base = strings.TrimSuffix(strings.TrimSuffix(rf.url, "/"), "/v1")
		if !isDaemon(ctx, base) {
			return nil
		}
	}
	c, err := deps.Daemon(cmd)
	if err != nil {
		return nil
	}
	if base != "" {
		c.BaseURL = base
	}
	return c
}

// isDaemon probes base for gpuhost's bench API without credentials (a
// --url server that is not gpuhost must not see the daemon's token): the
// list answers, or gpuhost's bearer challenge does.
func isDaemon(ctx context.Context, base string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/bench", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		return resp.Header.Get("WWW-Authenticate") == `Bearer realm="gpuhost"`
	}
	var list struct {
		Results *[]Summary `json:"results"`
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list) == nil && list.Results != nil
}

// uploadResult stores r in the daemon's store and returns where it is
// served; r.ID becomes the daemon's ID for it.
func uploadResult(ctx context.Context, c *api.Client, r *Result) (string, error) {
	var up UploadResponse
	if err := c.Post(ctx, "/api/bench/results", r, &up); err != nil {
		return "", err
	}
	r.ID = up.ID
	return c.BaseURL + up.Result, nil
}
