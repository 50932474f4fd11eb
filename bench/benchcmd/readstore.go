package benchcmd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/bench"
)

// resultReader is where list, show and compare read results: the daemon's
// store through its API, or a local results folder. Both answer the same
// way, so the commands print the same whichever holds the results.
type resultReader interface {
	List(ctx context.Context) ([]bench.Summary, []bench.Warning, error)
	Load(ctx context.Context, id string) (*bench.Result, error)
	// Where names the store for messages ("the daemon at http://…",
	// "/var/lib/gpuhost/bench").
	Where() string
}

// daemonReader reads the daemon's store: GET /api/bench and
// GET /api/bench/:id, the routes the panel's Bench page reads too.
type daemonReader struct{ c *api.Client }

func (d daemonReader) Where() string { return "the daemon at " + d.c.BaseURL }

func (d daemonReader) List(ctx context.Context) ([]bench.Summary, []bench.Warning, error) {
	var lr bench.ListResponse
	if err := d.c.Get(ctx, "/api/bench", &lr); err != nil {
		return nil, nil, fmt.Errorf("list the bench results of %s: %w", d.Where(), err)
	}
	return lr.Results, lr.Warnings, nil
}

func (d daemonReader) Load(ctx context.Context, id string) (*bench.Result, error) {
	var r bench.Result
	err := d.c.Get(ctx, "/api/bench/"+url.PathEscape(id), &r)
	var re *api.RemoteError
	switch {
	case errors.As(err, &re) && re.Status == http.StatusNotFound:
		// An unknown result id is the caller's usage error (64).
		return nil, usageError(fmt.Errorf("%w: %s in %s (%s)", bench.ErrNotFound, id, d.Where(), re.Detail))
	case err != nil:
		return nil, fmt.Errorf("read bench result %s from %s: %w", id, d.Where(), err)
	case r.SchemaVersion == 0:
		// 202: the id is the daemon's run in progress, not yet a result.
		return nil, fmt.Errorf("%w: %s is still running on %s", bench.ErrNotFound, id, d.Where())
	}
	return &r, nil
}

// localReader reads a results folder directly.
type localReader struct {
	s *bench.Store
	// why says why the local store is read instead of a daemon's (a daemon
	// not reached); empty when --dir chose it.
	why string
}

func (l localReader) Where() string {
	if l.why == "" {
		return l.s.Dir
	}
	return l.s.Dir + " (" + l.why + ")"
}

func (l localReader) List(context.Context) ([]bench.Summary, []bench.Warning, error) {
	all, warns, err := l.s.List()
	if err != nil {
		return nil, nil, err
	}
	sums := make([]bench.Summary, len(all))
	for i, r := range all {
		sums[i] = bench.Summarize(r)
	}
	return sums, warns, nil
}

// Load reads one result; an id the folder does not hold is the caller's
// usage error (64).
func (l localReader) Load(_ context.Context, id string) (*bench.Result, error) {
	r, err := l.s.Load(id)
	if errors.Is(err, bench.ErrNotFound) {
		return nil, usageError(err)
	}
	return r, err
}

// daemonProbeTimeout bounds the first request that decides whether the
// daemon holds the results.
const daemonProbeTimeout = 5 * time.Second

// readerFor picks where list, show and compare read: --dir names a folder;
// otherwise the daemon (found as every daemon command finds it: --url,
// $GPUHOST_URL, the config's listen, the default) when it answers its
// bench API, since that is where `bench run` and `bench switch` store
// results. Only when no daemon is configured or none answers does it read
// the local folder, and then it says so on stderr (stdout stays the
// answer, e.g. JSON).
func readerFor(ctx context.Context, cmd *cobra.Command, deps Deps) (resultReader, error) {
	env, _ := loadEnv(cmd, deps, true)
	store, err := storeFor(cmd, env)
	if err != nil {
		return nil, err
	}
	local := localReader{s: store}
	if dir, _ := cmd.Flags().GetString("dir"); dir != "" {
		return local, nil
	}
	if deps.Daemon == nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: no daemon configured; reading the local store %s\n", store.Dir)
		return local, nil
	}
	c, err := deps.Daemon(cmd)
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: no daemon configured (%v); reading the local store %s\n", err, store.Dir)
		return local, nil
	}
	pctx, cancel := context.WithTimeout(ctx, daemonProbeTimeout)
	defer cancel()
	var lr bench.ListResponse
	err = c.Get(pctx, "/api/bench", &lr)
	var ue *api.UnreachableError
	var re *api.RemoteError
	switch {
	case err == nil:
		return daemonReader{c}, nil
	case errors.As(err, &ue):
		fmt.Fprintf(cmd.ErrOrStderr(), "note: no daemon answers at %s; reading the local store %s\n", c.BaseURL, store.Dir)
		local.why = "the daemon at " + c.BaseURL + " was not reached; results it stored are not listed"
		return local, nil
	case errors.As(err, &re) && re.Status == http.StatusNotFound:
		fmt.Fprintf(cmd.ErrOrStderr(), "note: the daemon at %s has no bench store; reading the local store %s\n", c.BaseURL, store.Dir)
		return local, nil
	}
	// A daemon that answers but refuses (a token, a server error) is the
	// store the user meant: say why rather than show another store.
	return nil, fmt.Errorf("read the bench results of the daemon at %s: %w", c.BaseURL, err)
}
