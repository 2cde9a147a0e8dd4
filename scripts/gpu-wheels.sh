#!/usr/bin/env bash
# The wheels scripts/gpu-check.sh needs that the GPU machine lacks, downloaded where the package registries are
# reachable, for CPython 3.12 manylinux x86-64, at the payload's pins and hashes (remote_payload/requirements-cuda.lock):
#
#   scripts/gpu-wheels.sh [DIR]        (default .gpu-wheels/, git-ignored: name it in the device run's carry)
#
# The GPU machine has Python 3.12 with torch 2.11, triton 3.6, transformers 5.17, einops, safetensors, tokenizers,
# accelerate, huggingface-hub 1.33 and no network. It lacks:
# - flash-linear-attention and fla-core (the kernels under test; their one dependency, einops, is there);
# - transformers at the payload's pin: 5.17's Qwen3.5 code is not what GPU hosts run. It repeats the query/key
#   heads to the value heads before calling the gated-delta-rule kernel, where 5.24 hands fla the 16 key heads
#   (grouped value attention inside the kernel), and it takes the cache as past_key_values/cache_params where
#   5.24 takes cache=. 5.24's own dependencies are all on the machine at versions it accepts
#   (huggingface-hub >= 1.31, tokenizers >= 0.23.1, safetensors >= 0.8, regex, typer, tqdm, pyyaml, numpy).
# torch and triton stay the machine's (their wheels alone are far over the limit): the check records both next
# to the payload's pins. Prints each wheel, the total (the working tree that travels must stay under 64 MiB
# with them) and the install line the check uses.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(realpath -ms -- "${1:-$REPO/.gpu-wheels}")
PY="${PYTHON:-$REPO/.venv/bin/python}"
LOCK="$REPO/remote_payload/requirements-cuda.lock"
PACKAGES=(flash-linear-attention fla-core transformers)
LIMIT=$((64 * 1024 * 1024))

[ -x "$PY" ] || PY=python3
req=$(mktemp)
trap 'rm -f "$req"' EXIT
for name in "${PACKAGES[@]}"; do
  # The lock's entry: "name==version \" and its hash lines (the last one ends without a backslash).
  block=$(awk -v pkg="$name" '$0 ~ "^" pkg "==" {p = 1} p {print} p && !/\\$/ {p = 0}' "$LOCK")
  [ -n "$block" ] || { echo "gpu-wheels: $name is not pinned in $LOCK" >&2; exit 1; }
  echo "$block" >> "$req"
done

mkdir -p "$DIR"
# One version of each package only: two would stop the whole --no-deps install on the GPU machine.
find "$DIR" -maxdepth 1 -name '*.whl' -delete
"$PY" -m pip download -q --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DIR" -r "$req"

count=$(find "$DIR" -maxdepth 1 -name '*.whl' | wc -l)
[ "$count" -eq "${#PACKAGES[@]}" ] || { echo "gpu-wheels: expected ${#PACKAGES[@]} wheels in $DIR, found $count" >&2; exit 1; }
total=0
for whl in "$DIR"/*.whl; do
  size=$(stat -c %s "$whl")
  total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$whl")"
done
tracked=$(cd "$REPO" && git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
printf 'wheels: %d bytes (%.1f MiB); with the tracked files: %.1f MiB of the 64 MiB a device run carries\n' \
  "$total" "$(awk -v b="$total" 'BEGIN {print b / 1048576}')" "$(awk -v b="$((total + tracked))" 'BEGIN {print b / 1048576}')"
if [ "$total" -ge "$LIMIT" ] || [ $((total + tracked)) -ge "$LIMIT" ]; then
  echo "gpu-wheels: over the 64 MiB limit" >&2
  exit 1
fi
echo "install line (scripts/gpu-check.sh runs it before its steps):"
if [ "$DIR" = "$REPO/.gpu-wheels" ]; then
  "$REPO/scripts/gpu-check.sh" --print-install-line
else
  "$REPO/scripts/gpu-check.sh" --print-install-line --wheels "$DIR"
fi
