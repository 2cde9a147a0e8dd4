"""`python -m orchestrator.testing.sandbox up|down ROOT`: sandbox hosts by hand, outside the test suite."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Sequence

from orchestrator.testing import sandbox
from orchestrator.testing.errors import SandboxError
from orchestrator.testing.sandbox import Sandbox
from orchestrator.testing.state import teardown_state


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.testing.sandbox",
                                     description=(sandbox.__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start test hosts, print paths, wait for Ctrl-C, tear down")
    up.add_argument("root")
    up.add_argument("--hosts", default="kpro6,ct129", help="comma-separated host names (default: kpro6,ct129)")
    up.add_argument("--no-netns", action="store_true", help="use 127.0.0.x instead of network namespaces")
    up.add_argument("--keep", action="store_true", help="leave the hosts running and exit")
    down = sub.add_parser("down", help="tear down a sandbox left running with --keep")
    down.add_argument("root")
    return parser


def _up(args: argparse.Namespace) -> None:
    if not args.keep:
        # A shell without job control starts background commands with SIGINT ignored, and the ignore is
        # inherited; this command promises Ctrl-C (or kill -INT), so it takes SIGINT back before any host
        # exists (an interrupted start tears down what it made).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    box = Sandbox(args.root, [n for n in args.hosts.split(",") if n], netns=False if args.no_netns else None,
                  keep=args.keep)
    t0 = time.monotonic()
    with box:
        print(box.summary())
        print(f"started in {time.monotonic() - t0:.2f}s; try: ssh -F {box.ssh_config_path} "
              f"{next(iter(box.hosts))} hostname")
        if not args.keep:
            print("Ctrl-C to stop and tear down.")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print("\ntearing down")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "down":
            for line in teardown_state(args.root):
                print(line)
        else:
            _up(args)
        return 0
    except SandboxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
