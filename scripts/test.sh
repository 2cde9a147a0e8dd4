#!/usr/bin/env bash
# Run dfo's checks and test suite (sets up what it needs first: sshd, iproute2, .venv). Extra args go to
# pytest; with arguments the lint/type checks are skipped (a narrowed run is for iterating).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Caches kept between runs on one machine: the test wheelhouse, the fla and vLLM test venvs and the tiny
# fixture models. Each is rebuilt when missing or when what built it changed. Values set before are kept
# (.ci/run sets empty ones for each CI run).
export DFO_TEST_CACHE="${DFO_TEST_CACHE:-$HOME/.cache/dfo-test}"
export DFO_FIXTURE_CACHE="${DFO_FIXTURE_CACHE:-$DFO_TEST_CACHE/fixtures}"
if [ $# -eq 0 ]; then
  echo "test: ruff (lint + import order)" >&2
  .venv/bin/ruff check orchestrator remote_payload tests benchmarks
  echo "test: mypy" >&2
  .venv/bin/mypy orchestrator remote_payload
fi
# pytest exits 5 when no test ran: that is a failure here too.
exec .venv/bin/python -m pytest "$@"
