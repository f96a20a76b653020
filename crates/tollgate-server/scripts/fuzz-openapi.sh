#!/usr/bin/env bash
# Fuzzes a real `tollgate serve` from its own OpenAPI document with
# schemathesis, then checks that the conservation audit is clean.
#
#   crates/tollgate-server/scripts/fuzz-openapi.sh            # memory store
#   FUZZ_DATABASE_URL=postgres://... FUZZ_SECRET_FILE=key \
#     crates/tollgate-server/scripts/fuzz-openapi.sh          # PostgreSQL
#
# Checks: every schemathesis check except `positive_data_acceptance`: the
# service accepts less than a JSON schema can say (jiff's duration grammar,
# control characters in names, `1.0` as an integer, and state: balances,
# lease life-cycle), so schema-valid requests may rightly get a 4xx. What
# must hold: no 5xx, every response conforms to the document (status,
# content type, headers, body), schema-violating requests are rejected,
# credentials are not ignored, and the audit is clean afterwards.
#
# Environment: FUZZ_VENV (default target/schemathesis-venv), FUZZ_PORT
# (default 18099), FUZZ_MAX_EXAMPLES (default 100), CARGO_TARGET_DIR.
set -euo pipefail

root=$(cd "$(dirname "$0")/../../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
venv=${FUZZ_VENV:-$target/schemathesis-venv}
port=${FUZZ_PORT:-18099}
examples=${FUZZ_MAX_EXAMPLES:-100}
admin="tgadm1.fuzz-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
schemathesis_version=4.32.5

if [ ! -x "$venv/bin/schemathesis" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==$schemathesis_version"
fi

cargo build --quiet -p tollgate-server --bin tollgate
bin=$target/debug/tollgate

args=(serve --listen "127.0.0.1:$port" --admin-token "$admin" --clock test)
if [ -n "${FUZZ_DATABASE_URL:-}" ]; then
    args+=(--database-url "$FUZZ_DATABASE_URL" --secret-file "$FUZZ_SECRET_FILE")
fi
log=$(mktemp)
env -u DATABASE_URL TOLLGATE_LOG_LEVEL=warn "$bin" "${args[@]}" >"$log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
    grep -q "tollgate listening on" "$log" && break
    kill -0 $server 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.2
done
grep -q "tollgate listening on" "$log" || { cat "$log"; echo "server did not start"; exit 1; }

"$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
    --checks all --exclude-checks positive_data_acceptance \
    -H "Authorization: Bearer $admin" \
    --max-examples "$examples" --seed 1 --no-color

"$bin" audit --server "http://127.0.0.1:$port" --token "$admin" >/dev/null
echo "fuzz: no failures; audit clean"
