#!/usr/bin/env bash
# Mutation gate: every mutant cargo-mutants makes in tollgate's lease timing,
# grant policy and its deadline bound (timing.rs), migration 0017's legacy
# bound (instant_pair.rs), accounting and life-cycle rules (rules.rs) and
# conservation audit (audit.rs); in all of safetime (the cut tracker, the
# carried cut, uncertainty reasons, the sampler's tuning, the sealed horizon
# policy and its deadline check, the instant pair, the timestamp domain); and
# in lc-core's time and authority rules (rules.rs: expiry only on a certain
# cut, admission inside cut + horizon, renewal that never shortens, the state
# machines, the reconciler's lease plan, the input bounds; opkey.rs: the
# operation key's floor, receipt attachment and GC instant; shape.rs and
# command.rs: the shapes and the argv bounds; rate.rs: the admission rate's
# window; owner.rs: exec ownership, fenced writes, receipt replay and the
# release rule; input.rs: stdin input's bounds and order; hibernate.rs:
# sealing only on a certain cut, the exact idle boundary, the quiescence,
# attachment and resume checks; snapshot.rs: the snapshot manifest's path,
# parent, mode and size rules and its canonical form; approval.rs, claim.rs,
# deletion.rs and token.rs: the other authorities on the cut, an approval's
# start gate, a claim's takeover and fence, deletion grace and purge, a
# scoped token's acceptance and scope; observation.rs: the re-execution rule
# on a milestone, trusted captures, retry receipts v2 and v1) must be caught
# by the unit tests of the crate it is in. Scope, exclusions and reasons:
# docs/testing.md and .cargo/mutants.toml.
#
# Fails when any mutant is missed, times out, or is unviable (a mutant that
# does not compile proves nothing; the known ones are excluded by name in
# .cargo/mutants.toml, each with its reason, so a new one shows up here).
#
# The tree is copied (cargo-mutants' default), not mutated in place: two
# parallel jobs need two copies, and a copy leaves the working tree untouched
# even when the run is interrupted or someone edits while it runs.
#
# Environment (all optional):
#   MUTANTS_JOBS        parallel build dirs; default 2, one per core of the
#                       reference machine (cargo's jobserver shares the cores)
#   MUTANTS_TIMEOUT_S   per-mutant test timeout in seconds; default 60, more
#                       than 100 times the unit tests' run, so only a hang
#                       reaches it
#   MUTANTS_OUT         directory that receives mutants.out; default repo root
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# The version the scope and exclusions were written against (mutant names
# and the set of generated mutants change between releases).
cargo_mutants_version=27.1.0
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo mutants --version >/dev/null 2>&1; then
    echo "mutants.sh: installing cargo-mutants $cargo_mutants_version"
    cargo install --locked cargo-mutants --version "$cargo_mutants_version"
fi
installed="$(cargo mutants --version | awk '{print $2}')"
if [[ "$installed" != "$cargo_mutants_version" ]]; then
    echo "mutants.sh: note: cargo-mutants $installed; the gate was tuned on" \
        "$cargo_mutants_version" >&2
fi

# Each build dir (one per job) must build into its own target dir, inside
# the copy, which is cargo-mutants' default. Cargo hashes a workspace
# package's artifacts by its path relative to the workspace root, so two
# copies sharing one CARGO_TARGET_DIR write the same files, and one job can
# end up testing the other job's mutant.
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR CARGO_BUILD_BUILD_DIR

# Mutants need no debug info, and without it each mutant links faster.
export CARGO_PROFILE_DEV_DEBUG=false
# proptest must not write regression files into the build dirs.
export PROPTEST_DISABLE_FAILURE_PERSISTENCE=1

out_dir="${MUTANTS_OUT:-$repo}"
start_s=$(date +%s)
status=0
cargo mutants \
    --jobs "${MUTANTS_JOBS:-2}" \
    --timeout "${MUTANTS_TIMEOUT_S:-60}" \
    --output "$out_dir" \
    || status=$?
elapsed_s=$(($(date +%s) - start_s))

results="$out_dir/mutants.out"
count() { if [[ -f "$results/$1" ]]; then grep -c . "$results/$1" || true; else echo 0; fi; }
echo "mutants.sh: caught $(count caught.txt), missed $(count missed.txt)," \
    "timeout $(count timeout.txt), unviable $(count unviable.txt)" \
    "in ${elapsed_s}s (results in $results)"

if [[ -s "$results/unviable.txt" ]]; then
    echo "mutants.sh: unviable mutants: make each compile and be caught, or" \
        "exclude it in .cargo/mutants.toml with the reason:" >&2
    sed 's/^/  /' "$results/unviable.txt" >&2
    [[ $status -ne 0 ]] || status=1
fi
if [[ $status -ne 0 ]]; then
    # cargo-mutants: 2 = missed mutants, 3 = timeouts, 4 = baseline failed.
    for f in missed.txt timeout.txt; do
        if [[ -s "$results/$f" ]]; then
            echo "mutants.sh: ${f%.txt}:" >&2
            sed 's/^/  /' "$results/$f" >&2
        fi
    done
    echo "mutants.sh: FAILED (exit $status)" >&2
fi
exit "$status"
