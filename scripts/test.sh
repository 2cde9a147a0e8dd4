#!/usr/bin/env bash
# Run dfo's checks and test suite (sets up what it needs first: sshd, iproute2, .venv).
#
#   scripts/test.sh              lint, then every test on DFO_TEST_WORKERS processes (default 2), types beside them
#   scripts/test.sh --quick      lint, types and the quick tier: pure logic and the in-process CLI (no hosts,
#                                engine, fixture models or venvs; tests/conftest.py says which); the edit-test loop
#   scripts/test.sh ARGS...      pytest ARGS in one process, without lint (a narrowed run, for iterating)
#
# The full run spreads the tests over worker processes (pytest-xdist). The engine tests form one group that one
# worker runs alone (its venv and servers are built once); the sandbox hosts and fixture models are per worker or
# shared through the on-disk caches below.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Caches kept between runs on one machine: the test wheelhouse, the fla and vLLM test venvs and the tiny
# fixture models. Each is rebuilt when missing or when what built it changed. Values set before are kept
# (.ci/run sets empty ones for each CI run).
export DFO_TEST_CACHE="${DFO_TEST_CACHE:-$HOME/.cache/dfo-test}"
export DFO_FIXTURE_CACHE="${DFO_FIXTURE_CACHE:-$DFO_TEST_CACHE/fixtures}"
quick=
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
if [ $# -ne 0 ]; then  # a narrowed run: pytest ARGS alone (the quick tier's ARGS too)
  [ -z "$quick" ] || exec .venv/bin/python -m pytest -m quick "$@"
  exec .venv/bin/python -m pytest "$@"
fi
echo "test: ruff (lint + import order)" >&2
.venv/bin/ruff check orchestrator remote_payload tests benchmarks
# mypy is one process (35 s on one core): it runs beside the tests, which leave a core idle part of the time (the
# quick tier is one process), and its verdict is printed, and counts, when they end.
types_out="$(mktemp "${TMPDIR:-/tmp}/dfo-mypy.XXXXXX")"
trap 'rm -f "$types_out"' EXIT
echo "test: mypy, beside the tests (its verdict follows them)" >&2
.venv/bin/mypy orchestrator remote_payload >"$types_out" 2>&1 &
types_pid=$!
# pytest exits 5 when no test ran: that is a failure here too.
if [ -n "$quick" ]; then
  tests_rc=0
  .venv/bin/python -m pytest -m quick || tests_rc=$?
else
  workers="${DFO_TEST_WORKERS:-2}"
  echo "test: pytest on $workers worker(s)" >&2
  tests_rc=0
  .venv/bin/python -m pytest -n "$workers" --dist loadgroup --durations=25 || tests_rc=$?
fi
types_rc=0
wait "$types_pid" || types_rc=$?
echo "test: mypy" >&2
cat "$types_out" >&2
if [ "$types_rc" -ne 0 ]; then
  echo "test: mypy failed (exit $types_rc, above)" >&2
  [ "$tests_rc" -ne 0 ] || tests_rc=$types_rc
fi
exit "$tests_rc"
