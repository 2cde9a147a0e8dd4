#!/usr/bin/env bash
# Regenerate the sample outputs of README.md and docs/*.md (the blocks between `<!-- docs-output: NAME -->`
# markers) from real runs: `dfo demo --keep` on fresh sandbox hosts, then a few commands against them
# (orchestrator/demo/docs_outputs.py). A few minutes of CPU. Review with `git diff`, then commit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m orchestrator.demo.docs_outputs "$@"
