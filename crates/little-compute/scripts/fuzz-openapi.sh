#!/usr/bin/env bash
# Fuzzes a real Little Compute appliance from its own OpenAPI document with
# schemathesis, then stops it and checks that nothing is left behind.
#
#   crates/little-compute/scripts/fuzz-openapi.sh
#
# Starts `little-compute appliance up` on a fresh data directory (its own
# PostgreSQL, sampler, control plane, bubblewrap provider and worker),
# waits for `appliance.json` and a certain cut, creates a tenant with a few
# units and its API key, admits two cheap execs so the exec routes have
# real records to find, then runs schemathesis against
# `<url>/v1/openapi.json` twice: with the admin token acting for the tenant
# (`Lc-Tenant`), and with the tenant's key.
#
# Checks: every schemathesis check except `positive_data_acceptance`: the
# service accepts less than a JSON schema can say (runtime and shape names,
# argv bounds, capacity, idempotency keys), so schema-valid requests may
# rightly get a 4xx. What must hold: no 5xx, every response conforms to the
# document (status, content type, headers, body), schema-violating requests
# are rejected, and credentials are not ignored. An exec is admitted only
# for the `base` runtime and a known shape, so the fuzzer gets few; they
# run random argv, which fails to start or exits at once.
#
# Afterwards, with every unfinished exec cancelled: every exec terminal,
# every Reservation returned, every sandbox Lease released, the provider's
# inventory without a running instance and a clean Tollgate audit; then
# SIGTERM stops the appliance, which must exit 0 with every process it
# started (and every sandbox supervisor) gone.
#
# Environment: FUZZ_VENV (default target/schemathesis-venv, shared with
# Tollgate's fuzzer), FUZZ_MAX_EXAMPLES (default 100, as Tollgate's: per
# operation, for each of the two credentials), FUZZ_SEED (default 1),
# CARGO_TARGET_DIR.
set -euo pipefail

root=$(cd "$(dirname "$0")/../../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
venv=${FUZZ_VENV:-$target/schemathesis-venv}
examples=${FUZZ_MAX_EXAMPLES:-100}
seed=${FUZZ_SEED:-1}
schemathesis_version=4.32.5
# Bounds, in seconds (loops poll every 0.5 s): a new cluster and sampler
# epoch become certain within the appliance's own 120 s wait; releases of
# cancelled execs take a few worker passes; a stop gives each of five
# processes at most 20 s.
up_max_s=240
quiesce_max_s=120
stop_max_s=150
# Units of the fuzzed tenant at creation (the fuzzer's deposits add more).
tenant_units=4

if [ ! -x "$venv/bin/schemathesis" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==$schemathesis_version"
fi

cargo build --quiet -p little-compute -p lc-supervisor -p tollgate-safetime \
    -p tollgate-server --bin little-compute --bin lc-supervisor \
    --bin tollgate-safetime --bin tollgate
bin=$target/debug

work=$(mktemp -d /tmp/lc-fuzz.XXXXXX)
# The sampler and PostgreSQL run as their own accounts: they traverse it.
chmod 0711 "$work"
data=$work/lc
log=$work/up.log
up=
stop_appliance() {
    if [ -n "$up" ] && kill -0 "$up" 2>/dev/null; then
        kill -TERM "$up"
        for _ in $(seq 1 $((stop_max_s * 2))); do
            kill -0 "$up" 2>/dev/null || break
            sleep 0.5
        done
    fi
}
cleanup() {
    stop_appliance
    [ -z "$up" ] || wait "$up" 2>/dev/null || true
    # The provider's parent cgroups of this data directory, empty once
    # every instance was destroyed.
    local hex
    hex=$(printf '%s' "$data" | sha256sum | cut -c1-12)
    for c in memory pids cpu; do
        rmdir "/sys/fs/cgroup/$c/little-compute-$hex" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "fuzz: $*" >&2
    echo "--- appliance output" >&2
    tail -n 40 "$log" >&2 || true
    for f in "$data"/logs/*.log; do
        [ -f "$f" ] || continue
        echo "--- $f" >&2
        tail -n 20 "$f" >&2 || true
    done
    exit 1
}
json() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1:]: v=v[k]
print(v)' "$@"; }

"$bin/little-compute" appliance up --data-dir "$data" --listen 127.0.0.1:0 \
    </dev/null >"$log" 2>&1 &
up=$!
for _ in $(seq 1 $((up_max_s * 2))); do
    grep -q "^appliance ready" "$log" && break
    kill -0 "$up" 2>/dev/null || fail "the appliance exited during start-up"
    sleep 0.5
done
grep -q "^appliance ready" "$log" || fail "no certain cut within ${up_max_s}s"
[ -f "$data/appliance.json" ] || fail "appliance ready but no appliance.json"
running=$(cat "$data/appliance.json")
url=$(json url <<<"$running")
admin=$(cat "$(json admin_token_file <<<"$running")")
pids=$(python3 -c 'import json,sys; print(" ".join(str(p) for p in json.load(sys.stdin)["pids"].values()))' <<<"$running")
conf=$(cat "$data/appliance.conf.json")
owner_url="postgres://lc_owner:$(cat "$data/secrets/pg-owner")@127.0.0.1:$(json postgres <<<"$conf")/little_compute"
provider_url="http://127.0.0.1:$(json provider <<<"$conf")"
provider_token=$(cat "$data/secrets/provider-token")
sql() { psql "$owner_url" -XAtqc "$1"; }

tenant=$(curl -sf --json "{\"name\":\"fuzz\",\"units\":$tenant_units}" \
    -H "Authorization: Bearer $admin" -H "Idempotency-Key: fuzz-tenant" \
    "$url/v1/tenants") || fail "creating the tenant failed"
tenant_id=$(json tenant_id <<<"$tenant")
key=$(json api_key <<<"$tenant")
exec_ids=()
for cmd in '["sh","-c","echo fuzz; echo oops >&2; exit 3"]' '["true"]'; do
    e=$(curl -sf --json "{\"runtime\":\"base\",\"shape\":\"small\",\"command\":$cmd}" \
        -H "Authorization: Bearer $key" -H "Idempotency-Key: fuzz-exec-${#exec_ids[@]}" \
        "$url/v1/execs") || fail "admitting $cmd failed"
    exec_ids+=("$(json exec_id <<<"$e")")
done
echo "fuzz: appliance at $url, tenant $tenant_id, execs ${exec_ids[*]}"

# Hooks: a runtime tarball (`application/x-tar`) is sent as the raw bytes
# schemathesis generates for a binary body; and a request whose only
# violation is an undeclared header (`x-schemathesis-unknown-property`) is
# no violation of HTTP, where a server ignores headers it does not know, so
# its acceptance is not reported as accepted negative data. With the admin
# token, a case that carries no `Lc-Tenant` of its own acts for the fuzzed
# tenant (`LC_FUZZ_TENANT`); the header stays the fuzzer's to generate, so
# its boundary cases are still checked.
cat >"$work/hooks.py" <<'PY'
import os

import schemathesis

schemathesis.serializer.alias("application/x-tar", "application/octet-stream")


@schemathesis.hook
def filter_failure(context, failure, case, response):
    headers = {k.lower() for k in (case.headers or {})}
    unknown_header = "x-schemathesis-unknown-property" in headers
    return not (unknown_header and failure.code == "ST201")


@schemathesis.hook
def map_case(context, case):
    tenant = os.environ.get("LC_FUZZ_TENANT")
    if tenant is None:
        return case
    if case.headers is None:
        case.headers = {}
    if not any(k.lower() == "lc-tenant" for k in case.headers):
        case.headers["Lc-Tenant"] = tenant
    return case
PY
export SCHEMATHESIS_HOOKS=$work/hooks.py
st=("$venv/bin/schemathesis" run "$url/v1/openapi.json"
    --checks all --exclude-checks positive_data_acceptance
    --max-examples "$examples" --seed "$seed" --no-color)
LC_FUZZ_TENANT=$tenant_id "${st[@]}" -H "Authorization: Bearer $admin" ||
    fail "schemathesis with the admin token found failures"
"${st[@]}" -H "Authorization: Bearer $key" ||
    fail "schemathesis with the tenant key found failures"

# Every unfinished exec of every tenant is cancelled, then released.
cancelled=0
for row in $(sql "SELECT tenant_id || ':' || exec_id FROM lc_execs WHERE state <> 'terminal' ORDER BY exec_id LIMIT 1000"); do
    curl -sf -X POST -H "Authorization: Bearer $admin" -H "Lc-Tenant: ${row%%:*}" \
        -H "Idempotency-Key: fuzz-cancel-${row#*:}" "$url/v1/execs/${row#*:}/cancel" >/dev/null ||
        fail "cancelling exec ${row#*:} failed"
    cancelled=$((cancelled + 1))
done
invariants() {
    sql "SELECT (SELECT count(*) FROM lc_execs WHERE state <> 'terminal')
        || ' ' || (SELECT count(*) FROM lc_reservations WHERE state <> 'returned')
        || ' ' || (SELECT count(*) FROM lc_sandbox_leases WHERE state <> 'released')"
}
for _ in $(seq 1 $((quiesce_max_s * 2))); do
    [ "$(invariants)" = "0 0 0" ] && break
    sleep 0.5
done
left=$(invariants)
[ "$left" = "0 0 0" ] || fail "after ${quiesce_max_s}s (unfinished execs, held Reservations, unreleased Leases) = $left"
counts=$(sql "SELECT count(*) || ' execs (' || count(*) FILTER (WHERE terminal_reason = 'exited') || ' exited, '
    || count(*) FILTER (WHERE terminal_reason = 'start_failed') || ' start_failed, '
    || count(*) FILTER (WHERE terminal_reason = 'cancelled') || ' cancelled, '
    || count(*) FILTER (WHERE terminal_reason = 'expired') || ' expired), '
    || (SELECT count(*) FROM lc_reservations) || ' Reservations, '
    || (SELECT count(*) FROM lc_tenants) || ' tenants' FROM lc_execs")
running_instances=$(curl -sf -H "Authorization: Bearer $provider_token" "$provider_url/v1/instances" |
    python3 -c 'import json,sys; print(sum(1 for i in json.load(sys.stdin)["instances"] if i["state"] == "running"))') ||
    fail "reading the provider's inventory failed"
[ "$running_instances" = 0 ] || fail "$running_instances instances still running"
b=$(curl -sf -H "Authorization: Bearer $key" "$url/v1/tenants/$tenant_id")
[ "$(json held <<<"$b") $(json consumed <<<"$b") $(json available <<<"$b")" = "0 0 $(json deposited <<<"$b")" ] ||
    fail "tenant $tenant_id balances after the releases: $b"
# The audit opens the store with the policy the appliance recorded.
policy=($(sql "SELECT 'PT' || max_ttl_secs || '.' || lpad(max_ttl_nanos::text, 9, '0') || 'S',
    'PT' || reclaim_grace_secs || '.' || lpad(reclaim_grace_nanos::text, 9, '0') || 'S' FROM tollgate_policy" | tr '|' ' '))
audit=$(env -u DATABASE_URL TOLLGATE_LOG=warn "$bin/tollgate" audit --database-url "$owner_url" \
    --max-ttl "${policy[0]}" --reclaim-grace "${policy[1]}") ||
    fail "the Tollgate audit is not clean: $audit"
[ "$(json total_held <<<"$audit") $(json total_consumed <<<"$audit")" = "0 0" ] ||
    fail "the audit counts units held or consumed: $audit"

stop_appliance
kill -0 "$up" 2>/dev/null && fail "the appliance did not stop within ${stop_max_s}s"
code=0
wait "$up" || code=$?
up=
[ "$code" = 0 ] || fail "the appliance exited $code"
for p in $pids; do
    ! [ -d "/proc/$p" ] || grep -q '^State:.*[ZX]' "/proc/$p/status" ||
        fail "process $p of the appliance outlived it"
done
if pgrep -f -- "$data" >/dev/null; then
    fail "processes of $data outlived the appliance: $(pgrep -af -- "$data")"
fi
[ ! -e "$data/appliance.json" ] || fail "appliance.json is left behind"
echo "fuzz: no failures; $cancelled cancelled at the end; $counts; every Reservation returned; no instance running; audit clean; the appliance stopped with nothing left"
