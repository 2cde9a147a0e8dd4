#!/usr/bin/env bash
# The dfo demo: sets up what it needs (sshd, iproute2, .venv), then runs `dfo demo` on two local
# sandbox hosts. Extra arguments go to `dfo demo` (e.g. --keep; --engine vllm: offline and vLLM τ side by side).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/dfo demo "$@"
