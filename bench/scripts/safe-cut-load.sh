#!/usr/bin/env bash
# BENCHMARKS.md item 6: the HTTP service on PostgreSQL with the system clock
# and with the safe-cut clock (every request reads the persisted cut), side
# by side on one throwaway server, alternating, with the same load.
#
#   bash bench/scripts/safe-cut-load.sh [ROUNDS] [DURATION]
#
# Builds the release binaries into ${CARGO_TARGET_DIR:-target}, starts
# PostgreSQL 15 as the `postgres` user on port 15434 (harness settings:
# fsync off), a safe-time sampler, and for each round two fresh databases:
# one served on the system clock, one on the safe-cut clock.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-2}"; duration="${2:-20s}"
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -q -p tollgate-server -p tollgate-safetime -p tollgate-bench \
    --bin tollgate --bin tollgate-safetime --bin tollgate-load
bin="$target/release"
pgb=/usr/lib/postgresql/15/bin
d=$(mktemp -d /tmp/tg-safecut-bench.XXXX); chown postgres: "$d"; chmod 755 "$d"
sp=(setpriv --reuid=postgres --regid="$(id -g postgres)" --init-groups)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$d"; }
trap cleanup EXIT
"${sp[@]}" "$pgb/initdb" -A trust -U postgres -D "$d/data" >/dev/null
"${sp[@]}" "$pgb/postgres" -D "$d/data" -p 15434 -k "$d" -c listen_addresses=127.0.0.1 \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 \
    >"$d/pg.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do "$pgb/pg_isready" -q -h 127.0.0.1 -p 15434 && break; sleep 0.2; done
head -c 32 /dev/urandom > "$d/key"
tok=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=18090
for r in $(seq "$rounds"); do
  for clock in system safe-cut; do
    db="load_${r}_${clock/-/_}"
    "$pgb/psql" -q -h 127.0.0.1 -p 15434 -U postgres -c "create database $db"
    url="postgres://postgres@127.0.0.1:15434/$db"
    "$bin/tollgate" migrate --database-url "$url" >/dev/null 2>&1
    sampler=""
    if [ "$clock" = safe-cut ]; then
      "$bin/tollgate-safetime" run --database-url "$url" >"$d/sampler-$db.log" 2>&1 &
      sampler=$!; pids+=($sampler)
      for _ in $(seq 100); do
        "$bin/tollgate-safetime" status --database-url "$url" 2>/dev/null | grep -q '"certain":true' && break
        sleep 0.2
      done
    fi
    port=$((port + 1))
    "$bin/tollgate" serve --listen "127.0.0.1:$port" --database-url "$url" --secret-file "$d/key" \
        --admin-token "$tok" --reclaim-grace PT1S --reclaim-interval PT1S --clock "$clock" \
        >"$d/serve-$db.log" 2>&1 &
    serve=$!; pids+=($serve)
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
    echo "== round $r, clock $clock" >&2
    "$bin/tollgate-load" --server "http://127.0.0.1:$port" --admin-token "$tok" \
        --accounts 200 --duration "$duration" --concurrency 16 2>/dev/null | grep -E '^\| (all|acquire)'
    kill "$serve"; wait "$serve" 2>/dev/null || true
    if [ -n "$sampler" ]; then kill "$sampler"; wait "$sampler" 2>/dev/null || true; fi
  done
done
