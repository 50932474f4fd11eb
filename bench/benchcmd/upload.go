package benchcmd

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/bench"
)

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
		Results *[]bench.Summary `json:"results"`
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list) == nil && list.Results != nil
}

// uploadResult stores r in the daemon's store and returns where it is
// served; r.ID becomes the daemon's ID for it.
func uploadResult(ctx context.Context, c *api.Client, r *bench.Result) (string, error) {
	var up bench.UploadResponse
	if err := c.Post(ctx, "/api/bench/results", r, &up); err != nil {
		return "", err
	}
	r.ID = up.ID
	return c.BaseURL + up.Result, nil
}
