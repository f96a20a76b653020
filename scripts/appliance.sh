#!/usr/bin/env bash
# Little Compute on one fresh machine, in one command:
#
#   bash scripts/appliance.sh [DIR] [appliance up options...]
#
# Installs the Debian packages the appliance needs when they are missing
# (postgresql-15 for the server binaries, bubblewrap and slirp4netns for the sandboxes,
# util-linux for setpriv), builds the release binaries (little-compute, lc,
# lc-supervisor, tollgate-safetime), and runs `little-compute appliance up
# --data-dir DIR` (default /var/lib/little-compute) in the foreground until
# Ctrl-C. DIR and its parents must be searchable by other users (PostgreSQL
# and the sandboxes run under their own accounts).
#
# This is a single-host installation: the safe-time sampler runs here as
# its own unprivileged user, outside every sandbox. Production runs
# samplers on separate hardened hosts (`appliance up --sampler external`).
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${1:-/var/lib/little-compute}"
if [ "$#" -gt 0 ]; then shift; fi

missing=()
pg_bin="${LC_PG_BIN:-/usr/lib/postgresql/15/bin}"
if [ ! -x "$pg_bin/initdb" ] || [ ! -x "$pg_bin/postgres" ]; then
  echo "appliance.sh: PostgreSQL server binaries missing under $pg_bin; installing postgresql-15" >&2
  missing+=(postgresql-15)
fi
if ! command -v bwrap >/dev/null 2>&1; then
  echo "appliance.sh: bwrap missing; installing bubblewrap (the sandboxes run in it)" >&2
  missing+=(bubblewrap)
fi
if ! command -v slirp4netns >/dev/null 2>&1; then
  echo "appliance.sh: slirp4netns missing; installing slirp4netns (the network shapes' NAT)" >&2
  missing+=(slirp4netns)
fi
if ! command -v setpriv >/dev/null 2>&1; then
  echo "appliance.sh: setpriv missing; installing util-linux" >&2
  missing+=(util-linux)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "appliance.sh: need root to install ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "appliance.sh: cargo is missing; install the Rust toolchain (rustup) first" >&2
  exit 1
fi
cargo build --release -p little-compute -p lc-supervisor -p tollgate-safetime
bin="${CARGO_TARGET_DIR:-$PWD/target}/release"
echo "appliance.sh: binaries in $bin (lc is the client: $bin/lc --data-dir $dir ...)"
exec "$bin/little-compute" appliance up --data-dir "$dir" "$@"
