// Package pgtest starts a real, throw-away PostgreSQL server for tests, so
// code that talks to PostgreSQL is tested against the real thing (its
// permission checks, read-only transactions and timeouts) rather than a
// mock that would agree with whatever the code assumes.
//
// It uses Debian's server binaries (/usr/lib/postgresql/<version>/bin). When
// they are missing the test is skipped with a loud message, unless
// GPUHOST_REQUIRE_POSTGRES=1 (set by CI), in which case it fails.
package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"gpuhost/internal/testkit"
)

// RequireEnv is the environment variable that turns "PostgreSQL is not
// installed" from a skip into a failure, so CI cannot silently pass without
// running the database tests.
const RequireEnv = "GPUHOST_REQUIRE_POSTGRES"

// BinDir returns the newest /usr/lib/postgresql/*/bin holding initdb,
// pg_ctl and postgres, or "" when there is none.
func BinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		ok := true
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if _, err := os.Stat(filepath.Join(d, b)); err != nil {
				ok = false
				break
			}
		}
		if ok {
			return d
		}
	}
	return ""
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// Start initialises a fresh cluster in a temporary directory, starts it on
// a spare loopback port with its socket in that directory, and returns a
// DSN for the superuser `postgres` (over the Unix socket, trust auth) plus
// a stop function that shuts the server down and removes the directory.
// TCP connections on 127.0.0.1 require a password (scram-sha-256), so tests
// can exercise real authentication failures.
//
// When running as root the server runs as the `postgres` system user
// (PostgreSQL refuses to run as root); otherwise as the current user.
// stop is also registered with t.Cleanup, so calling it is optional; it is
// safe to call more than once.
func Start(t testing.TB) (dsnAdmin string, stop func()) {
	t.Helper()
	bin := BinDir()
	if bin == "" {
		msg := "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (install Debian's postgresql package)"
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s; %s=1 requires them", msg, RequireEnv)
		}
		t.Skipf("SKIPPING REAL-POSTGRES TEST: %s; set %s=1 to make this a failure", msg, RequireEnv)
	}

	runAs, uid, gid, err := serverUser()
	if err != nil {
		t.Fatalf("pgtest: choose the server user: %v", err)
	}
	dir, err := os.MkdirTemp("", "gpuhost-pgtest-")
	if err != nil {
		t.Fatalf("pgtest: create temp dir: %v", err)
	}
	if runAs != "" {
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			t.Fatalf("pgtest: chown %s to %s: %v", dir, runAs, err)
		}
	}
	data := filepath.Join(dir, "data")
	logFile := filepath.Join(dir, "server.log")
	port := testkit.FreePort(t)

	run := func(timeout time.Duration, name string, args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		path := filepath.Join(bin, name)
		var cmd *exec.Cmd
		if runAs != "" {
			cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", runAs, "--", path}, args...)...)
		} else {
			cmd = exec.CommandContext(ctx, path, args...)
		}
		cmd.Dir = dir // the postgres user may not be able to read the test's cwd
		cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %v: %w\n%s", name, args, err, out.String())
		}
		return nil
	}

	cleanupDir := func() { _ = os.RemoveAll(dir) }
	if err := run(60*time.Second, "initdb", "-D", data, "-U", "postgres", "-E", "UTF8", "--no-locale",
		"--auth-local=trust", "--auth-host=scram-sha-256", "-N"); err != nil {
		cleanupDir()
		t.Fatalf("pgtest: initdb: %v", err)
	}
	opts := fmt.Sprintf("-p %d -k %s -h 127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50", port, dir)
	if err := run(60*time.Second, "pg_ctl", "-D", data, "-l", logFile, "-o", opts, "-w", "-t", "50", "start"); err != nil {
		logText, _ := os.ReadFile(logFile)
		cleanupDir()
		t.Fatalf("pgtest: pg_ctl start: %v\nserver log:\n%s", err, logText)
	}

	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		if err := run(30*time.Second, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"); err != nil {
			t.Logf("pgtest: pg_ctl stop: %v", err)
		}
		cleanupDir()
	}
	t.Cleanup(stop)
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", dir, port), stop
}

// serverUser returns the user to run the server as: "" (the current user)
// unless we are root, in which case the `postgres` system user.
func serverUser() (name string, uid, gid int, err error) {
	if os.Geteuid() != 0 {
		return "", 0, 0, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return "", 0, 0, fmt.Errorf("running as root needs a `postgres` system user: %w", err)
	}
	uid, err = strconv.Atoi(u.Uid)
	if err != nil {
		return "", 0, 0, fmt.Errorf("parse uid %q of user postgres: %w", u.Uid, err)
	}
	gid, err = strconv.Atoi(u.Gid)
	if err != nil {
		return "", 0, 0, fmt.Errorf("parse gid %q of user postgres: %w", u.Gid, err)
	}
	return "postgres", uid, gid, nil
}
