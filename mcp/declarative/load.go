package declarative

import (
	"context"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// DefaultDir is where the daemon looks for connector files when the
// config names no other directory.
const DefaultDir = "/etc/gpuhost/connectors.d"

// Load parses every *.yaml file in dir (sorted by name; hidden files are
// skipped). A broken file yields an error naming it and the others still
// load, so one typo does not take every declarative tool away. A missing
// directory is not an error: it just means no declarative connectors. Two
// files declaring the same name are an error for the later one.
func Load(dir string) ([]connector.Named, []error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("read connectors directory %s: %w", dir, err)}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var (
		out  []connector.Named
		errs []error
		from = map[string]string{}
	)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || filepath.Ext(name) != ".yaml" {
			continue
		}
		path := filepath.Join(dir, name)
		data, err := readFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c, err := Parse(path, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, dup := from[c.Name()]; dup {
			errs = append(errs, fmt.Errorf("%s: name: connector %q is already declared in %s", path, c.Name(), prev))
			continue
		}
		from[c.Name()] = path
		out = append(out, connector.Named{Name: c.Name(), Connector: c})
	}
	return out, errs
}

// readFile reads at most maxFileBytes+1 so a huge or endless file (a FIFO,
// /dev/zero behind a symlink) cannot stall or fill memory.
func readFile(path string) ([]byte, error) {
	// Stat before Open: opening a FIFO would block until a writer comes.
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read connector file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (mode %s)", path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read connector file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read connector file %s: %w", path, err)
	}
	return data, nil
}

// Watch calls reload each time the process gets SIGHUP, until ctx ends;
// run it in its own goroutine. Signals that arrive while reload runs are
// coalesced into one more call, so a burst of `systemctl reload` does not
// queue up rebuilds. dir is only named in the log line: reload decides
// what to read (normally Load(dir) and a registry rebuild).
func Watch(ctx context.Context, dir string, reload func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	defer signal.Stop(ch)
	watch(ctx, ch, func() {
		slog.Info("SIGHUP: reloading declarative connectors", "dir", dir)
		reload()
	})
}

func watch(ctx context.Context, ch <-chan os.Signal, reload func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			reload()
		}
	}
}
