#!/usr/bin/env bash
# govulncheck against an offline vulnerability database (the public
# vulnerability service is not reachable from every build machine).
# The database is built from the pinned golang.org/x/vulndb module (its
# data/osv reports, indexed by its own cmd/indexdb) into bin/vulndb once
# per pinned version; govulncheck then reads it through file://. Only the
# module proxy is needed, and the result depends only on the pinned
# versions, the code and the toolchain (GOTOOLCHAIN).
# Usage: scripts/vulncheck.sh [govulncheck flags] [packages]  (default ./...)
# Exit status: non-zero when a reachable vulnerability is found (go run
# prints govulncheck's "exit status 3" and exits 1) or the check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
VULN_VERSION=v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
db=bin/vulndb

if [ "$(cat "$db/.vulndb-version" 2>/dev/null)" != "$VULNDB_VERSION" ]; then
  echo "vulncheck: building $db from golang.org/x/vulndb@$VULNDB_VERSION" >&2
  src=$("$GO" mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  if [ -z "$src" ] || [ ! -d "$src/data/osv" ]; then
    echo "vulncheck: no data/osv in golang.org/x/vulndb@$VULNDB_VERSION (got dir '$src')" >&2
    exit 1
  fi
  rm -rf "$db.tmp"
  "$GO" run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$db.tmp"
  echo "$VULNDB_VERSION" >"$db.tmp/.vulndb-version"
  rm -rf "$db"
  mv "$db.tmp" "$db"
fi

[ $# -gt 0 ] || set -- ./...
"$GO" version
exec "$GO" run "golang.org/x/vuln/cmd/govulncheck@$VULN_VERSION" -db "file://$PWD/$db" "$@"
