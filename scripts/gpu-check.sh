#!/usr/bin/env bash
# The GPU path in one prepared run: four steps (env, fla, kernel_path, cost), each its own process under its
# own time limit, inside one overall budget; OUT_DIR gets gpu-check.json (rewritten after every step, so a
# step that overruns or fails leaves the others' figures), gpu-check.md (a summary) and gpu-check.log.
#
#   scripts/gpu-check.sh OUT_DIR [--smoke] [--wheels DIR] [--python PY] [--budget SECONDS]
#   scripts/gpu-check.sh --print-install-line [--wheels DIR] [--python PY]
#
# --smoke: every step at toy size on the CPU (CI runs it: tests/payload/diagnose/test_gpu_kit.py). Without it the
# steps need a CUDA GPU; the wheels the machine lacks (scripts/gpu-wheels.sh puts them in .gpu-wheels/) are
# installed first into a private scratch folder put on PYTHONPATH ahead of the machine's own packages: a new
# one from remote_payload/scratch.py (mkdtemp: unpredictable, exclusive, 0700, removed at the end), or
# $DFO_GPU_SITE, created 0700 or used only if it is a folder of this user's that nobody else can enter.
# What the steps measure: remote_payload/diagnose/gpu_kit/__init__.py. Exit status 0 when every step passed,
# 1 otherwise, 2 for bad arguments (or an unsafe $DFO_GPU_SITE).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

MODE=gpu
OUT=
PY=python3
WHEELS=.gpu-wheels  # relative to the repository root, where every command below runs
BUDGET=
PRINT_INSTALL=
SITE=

usage() { sed -n '6,7p' "$0" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) MODE=smoke ;;
    --wheels) WHEELS=$(realpath -ms -- "${2:?--wheels needs a folder}"); shift ;;
    --python) PY="${2:?--python needs an interpreter}"; case "$PY" in */*) PY=$(realpath -ms -- "$PY") ;; esac; shift ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift ;;
    --print-install-line) PRINT_INSTALL=1 ;;
    -h|--help) usage ;;
    -*) echo "gpu-check: unknown option $1" >&2; usage ;;
    *) [ -z "$OUT" ] || { echo "gpu-check: one OUT_DIR only (got $OUT and $1)" >&2; usage; }; OUT=$(realpath -ms -- "$1") ;;
  esac
  shift
done
cd "$REPO" || exit 2

# The site folder comes from the one helper for shared places (remote_payload/scratch.py, stdlib only): never
# a fixed name in /tmp, which another local user could create first and fill with a sitecustomize.py.
scratch() { PYTHONPATH="$REPO" "$PY" -m remote_payload.scratch "$@"; }
if [ -n "${DFO_GPU_SITE:-}" ]; then SITE_ARGS=(own "$DFO_GPU_SITE"); else SITE_ARGS=(new dfo-gpu-site-); fi
install_line() {
  printf '%q -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" %s/*.whl' \
    "$PY" "$(printf '%q' "$WHEELS")"
}
if [ -n "$PRINT_INSTALL" ]; then  # run at the repository root, as the relative paths in it say
  printf 'SITE=$(PYTHONPATH=. %q -m remote_payload.scratch %s) && %s && export PYTHONPATH="$SITE"\n' \
    "$PY" "$(printf '%q ' "${SITE_ARGS[@]}" | sed 's/ $//')" "$(install_line)"
  exit 0
fi
[ -n "$OUT" ] || { echo "gpu-check: OUT_DIR is required" >&2; usage; }
case "$BUDGET" in ''|*[!0-9]*) [ -z "$BUDGET" ] || { echo "gpu-check: --budget takes whole seconds" >&2; exit 2; } ;; esac

# Per-step limits (seconds), each capped by what is left of the overall budget: on an H200 the whole run must
# end within 8 minutes, wheel install included. Measured on a fresh H200 (2026-12-04): env 4 s, fla about 230 s
# cold (Triton compiles fla's kernels on first use: the fixture's eval took 76 s cold, 27 s warm) and 84 s warm,
# kernel_path 40 s, cost 90 s. The smoke's limits only guard CI against a hang (it takes ~20 s idle).
if [ "$MODE" = gpu ]; then
  STEPS=(env:60 fla:300 kernel_path:150 cost:240)
  BUDGET="${BUDGET:-470}"
else
  STEPS=(env:120 fla:300 kernel_path:300 cost:300)
  BUDGET="${BUDGET:-900}"
fi
RESERVE=20      # kept back at every step for the kill grace and the merge
MIN_STEP=20     # a step with less time than this left is skipped, not started
KILL_AFTER=10

mkdir -p "$OUT" || exit 2
LOG="$OUT/gpu-check.log"
PARTS=$(scratch new dfo-gpu-parts-) || exit 2
: > "$LOG"
START=$(date +%s)
DEADLINE=$((START + BUDGET))

log() { echo "[gpu-check $(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
merge() {
  "$PY" -m remote_payload.diagnose.gpu_kit merge --parts "$PARTS" --mode "$MODE" --started "$START" \
    --out "$OUT/gpu-check.json" --md "$OUT/gpu-check.md" >> "$LOG" 2>&1 || log "merge failed (see above)"
}

export PYTHONPATH="$REPO" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error \
  TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1
log "mode $MODE, budget ${BUDGET}s, python $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])' 2>&1)"
if [ "$MODE" = gpu ]; then
  if compgen -G "$WHEELS/*.whl" > /dev/null; then
    if ! SITE=$(scratch "${SITE_ARGS[@]}" 2> "$PARTS/site.err"); then
      log "$(cat "$PARTS/site.err") (unset DFO_GPU_SITE for a fresh private folder)"
      rm -rf "$PARTS"; exit 2
    fi
    [ -n "${DFO_GPU_SITE:-}" ] || trap 'rm -rf "$SITE"' EXIT  # a folder of this run's own goes with it
    log "installing $(ls "$WHEELS"/*.whl | wc -l) wheel(s) from $WHEELS into $SITE: $(install_line)"
    if eval "$(install_line)" >> "$LOG" 2>&1; then
      export PYTHONPATH="$SITE:$REPO"
    else
      log "wheel install failed: the steps run on the machine's own packages (see the log)"
    fi
  else
    log "no wheels in $WHEELS: the steps run on the machine's own packages (scripts/gpu-wheels.sh makes them)"
  fi
fi

run_step() {
  local name=$1 own=$2 now left limit t0 rc secs
  now=$(date +%s)
  left=$((DEADLINE - now - RESERVE))
  limit=$(( own < left ? own : left ))
  if [ "$limit" -lt "$MIN_STEP" ]; then
    log "step $name skipped: ${left}s left of the budget"
    printf '{"skipped": true, "rc": null, "seconds": 0, "limit_s": %d}\n' "$limit" > "$PARTS/$name.status"
    merge
    return
  fi
  log "step $name (limit ${limit}s)"
  t0=$(date +%s.%N)
  timeout --kill-after="$KILL_AFTER" "$limit" \
    "$PY" -m remote_payload.diagnose.gpu_kit step "$name" --part "$PARTS/$name.json" --mode "$MODE" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  printf '{"rc": %d, "seconds": %s, "limit_s": %d}\n' "$rc" "$secs" "$limit" > "$PARTS/$name.status"
  log "step $name: exit $rc after ${secs}s"
  merge
}

for entry in "${STEPS[@]}"; do
  run_step "${entry%%:*}" "${entry##*:}"
done
log "done in $(( $(date +%s) - START ))s: $OUT/gpu-check.json"
cat "$OUT/gpu-check.md" 2>/dev/null
rm -rf "$PARTS"
"$PY" - "$OUT/gpu-check.json" <<'EOF'
import json, sys
steps = json.load(open(sys.argv[1]))["steps"]
sys.exit(0 if all(s["status"] == "ok" for s in steps.values()) else 1)
EOF
