#!/usr/bin/env bash
# Machine-check the Tollgate formal model.
#   1. installs Coq (Debian package) if coqc is missing,
#   2. rejects unproved or assumed declarations in any .v file,
#   3. compiles every .v file listed in _CoqProject, in place,
#   4. requires Print Assumptions of every `Theorem` to be closed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
FORMAL_DIR="$(pwd)"

# --- 1. toolchain ----------------------------------------------------------
if ! command -v coqc >/dev/null 2>&1; then
  echo "coqc not found; installing coq via apt-get" >&2
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends coq
fi
echo "== $(coqc --version | head -n 1)"

# --- 2. forbidden vernacular -------------------------------------------------
# Case-sensitive whole-word match, comments included (the files avoid these
# words entirely).
forbidden='\b(Admitted|admit|Axiom|Axioms|Parameter|Parameters|Hypothesis|Hypotheses|Conjecture)\b'
mapfile -t vfiles < <(find . -name '*.v' -type f | sed 's|^\./||' | sort)
if [ "${#vfiles[@]}" -eq 0 ]; then
  echo "FAIL: no .v files found under $FORMAL_DIR" >&2
  exit 1
fi
if grep -nHE "$forbidden" "${vfiles[@]}" >&2; then
  echo "FAIL: forbidden word(s) found at the file:line locations above" >&2
  exit 1
fi
echo "== no unproved or assumed declarations in: ${vfiles[*]}"

# Domain constants: a Rust test parses these exact lines, keep them intact.
for line in \
  'Definition ts_min_ns : Z := -377705023201000000000.' \
  'Definition ts_max_ns : Z := 253402207200999999999.'; do
  if ! grep -qFx -- "$line" Tollgate/LeaseTiming.v; then
    echo "FAIL: Tollgate/LeaseTiming.v:1: missing exact line: $line" >&2
    exit 1
  fi
done

# --- 3. compile --------------------------------------------------------------
# Load-path flags (-R/-Q) and the ordered file list come from _CoqProject.
flags=()
abs_flags=()   # same mappings with absolute physical paths (for use from $tmp)
files=()
while read -r a b c; do
  case "$a" in
    ''|'#'*) ;;
    -R|-Q) flags+=("$a" "$b" "$c"); abs_flags+=("$a" "$FORMAL_DIR/$b" "$c") ;;
    *.v) files+=("$a") ;;
    *) echo "FAIL: unsupported _CoqProject line: $a $b $c" >&2; exit 1 ;;
  esac
done < _CoqProject

for v in "${vfiles[@]}"; do
  listed=0
  for f in "${files[@]}"; do [ "$f" = "$v" ] && listed=1; done
  if [ "$listed" -eq 0 ]; then
    echo "FAIL: $v is not listed in _CoqProject (it would not be checked)" >&2
    exit 1
  fi
done

for f in "${files[@]}"; do
  echo "== coqc ${flags[*]} $f"
  coqc "${flags[@]}" "$f"
done

# --- 4. Print Assumptions ------------------------------------------------------
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "== Print Assumptions"
status=0
count=0
for f in "${files[@]}"; do
  # Logical module name: apply the matching -R/-Q mapping to the path.
  mod=""
  for ((i = 0; i < ${#flags[@]}; i += 3)); do
    phys="${flags[i+1]%/}"
    logical="${flags[i+2]}"
    if [ "$phys" = "." ]; then
      rel="$f"
    elif [[ "$f" == "$phys"/* ]]; then
      rel="${f#"$phys"/}"
    else
      continue
    fi
    rel="${rel%.v}"
    mod="$logical.${rel//\//.}"
    break
  done
  if [ -z "$mod" ]; then
    echo "FAIL: no -R/-Q mapping in _CoqProject covers $f" >&2
    exit 1
  fi

  mapfile -t theorems < <(sed -nE 's/^[[:space:]]*Theorem[[:space:]]+([A-Za-z0-9_'"'"']+).*/\1/p' "$f")
  for thm in "${theorems[@]}"; do
    count=$((count + 1))
    printf 'Require %s.\nPrint Assumptions %s.%s.\n' "$mod" "$mod" "$thm" > "$tmp/PA.v"
    out="$(cd "$tmp" && coqc "${abs_flags[@]}" PA.v 2>&1)" || {
      echo "$mod.$thm: coqc failed:" >&2; echo "$out" >&2; status=1; continue; }
    out="$(printf '%s' "$out" | tr -s '[:space:]' ' ' | sed 's/^ //; s/ $//')"
    echo "$mod.$thm: $out"
    if [ "$out" != "Closed under the global context" ]; then
      echo "FAIL: $mod.$thm depends on assumptions (see above)" >&2
      status=1
    fi
  done
done

if [ "$count" -eq 0 ]; then
  echo "FAIL: no Theorem declarations found" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  exit 1
fi
echo "== OK: $count theorems checked, all closed under the global context"
