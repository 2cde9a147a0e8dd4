"""Entry point for the fla venv: activate the CPU shim, then run the payload or a script (tests only).

    <fla-venv>/bin/python tests/fla_cpu/bootstrap.py -m remote_payload eval ... --kernel fla
    <fla-venv>/bin/python tests/fla_cpu/bootstrap.py SCRIPT.py ARGS...

DFO_FLA_SHIM=off runs the same without the shim (Triton then has no driver on a CPU host).

The shim must patch Triton before fla is imported (fla decorates its kernels at import time), and the
payload must be importable from the repository without being installed in that venv.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def main(argv: list[str]) -> None:
    sys.path[:0] = [str(HERE), str(REPO)]
    if os.environ.get("DFO_FLA_SHIM") != "off":  # "off": the same venv without the interpreter (refusal tests)
        import shim

        shim.activate()
    if len(argv) >= 2 and argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    else:
        sys.exit("usage: bootstrap.py (-m MODULE | SCRIPT) [ARGS...]")


if __name__ == "__main__":
    main(sys.argv[1:])
