"""The tiny fixtures the steps use, built in a child process (``python -m remote_payload fixtures``).

Not in the step's own process: building a fixture applies the payload's CPU kernel policy, which makes fla
unimportable for the rest of that process, and a step that then loaded the target with ``--kernel fla`` would
find transformers bound to its torch code. The child takes the fixture cache ($DFO_FIXTURE_CACHE) as usual.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BUILD_TIMEOUT_S = 240


def build(out: Path, what: list[str]) -> Path:
    cmd = [sys.executable, "-m", "remote_payload", "fixtures", "--out", str(out), "--what", ",".join(what),
           "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-5:]
        raise RuntimeError(f"building fixtures {', '.join(what)} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return Path(out)
