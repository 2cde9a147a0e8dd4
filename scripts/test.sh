#!/usr/bin/env bash
# Run dfo's test suite (sets up what it needs first: sshd, iproute2, .venv). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# pytest exits 5 when no test ran: that is a failure here too.
exec .venv/bin/python -m pytest "$@"
