"""``python -m remote_payload.diagnose.gpu_kit``: one step, the merge, or the CPU-interpreter figures.

    ... step NAME --part FILE [--mode gpu|smoke] [--device cuda|cpu] [--kernel fla|torch|auto]
    ... merge --parts DIR --mode gpu|smoke [--started EPOCH] --out FILE.json [--md FILE.md]
    ... record-cpu-figures --out FILE.json      (in the tests' fla venv, through tests/fla_cpu/bootstrap.py)

scripts/gpu-check.sh runs the steps and the merge; the defaults follow the mode (gpu: cuda and fla; smoke: cpu,
and the kernel path the payload picks there, torch).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
from pathlib import Path

from remote_payload.diagnose.gpu_kit.merge import STEPS
from remote_payload.diagnose.gpu_kit.part import Part
from remote_payload.scratch import private_tmp

DEFAULTS = {"gpu": {"device": "cuda", "kernel": "fla"}, "smoke": {"device": "cpu", "kernel": "auto"}}


def _step_module(name: str):
    from remote_payload.diagnose.gpu_kit import cost_step, env_step, fla_step, kernel_path_step

    return {"env": env_step, "fla": fla_step, "kernel_path": kernel_path_step, "cost": cost_step}[name]


def _terminated(signum, frame):
    # The script's timeout sends SIGTERM: unwind (sections save what they hold, scratch folders go) and exit.
    raise SystemExit(128 + signum)


def run_step(args) -> int:
    device = args.device or DEFAULTS[args.mode]["device"]
    kernel = args.kernel or DEFAULTS[args.mode]["kernel"]
    part = Part(Path(args.part), args.name, args.mode)
    part.data.update(device=device, kernel=kernel)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        import torch

        if args.mode == "smoke":
            torch.set_num_threads(1)  # toy sizes gain nothing from threads; CI machines are small and busy
        if device == "cuda" and args.name != "env" and not torch.cuda.is_available():  # env reports what there is
            raise RuntimeError("this step needs a CUDA device and torch sees none (run --smoke on a CPU machine)")
        module = _step_module(args.name)
        if args.name == "env":
            module.run(part, args.mode, device)
        else:
            with private_tmp(f"dfo-gpu-kit-{args.name}-") as work:
                module.run(part, args.mode, device, kernel, Path(work))
    except Exception as exc:  # noqa: BLE001 - whatever stopped the step is recorded in its part, not lost
        part.data["errors"]["step"] = {"type": type(exc).__name__, "message": str(exc)[:2000],
                                       "traceback": traceback.format_exc().strip().splitlines()[-12:]}
    return part.finish()


def run_merge(args) -> int:
    from remote_payload.diagnose.gpu_kit.merge import assemble, markdown
    from remote_payload.inputs.cache import atomic_write_bytes, atomic_write_json

    report = assemble(Path(args.parts), args.mode, args.started)
    atomic_write_json(Path(args.out), report)
    if args.md:
        atomic_write_bytes(Path(args.md), markdown(report).encode())
    return 0


def record_cpu_figures(args) -> int:
    """The per-layer tables on CPU with fla's kernels through Triton's interpreter (the tests' shim)."""
    from remote_payload.diagnose.gpu_kit import fixtures as kit_fixtures
    from remote_payload.diagnose.gpu_kit.fla_step import DTYPES, TABLE_NEW_TOKENS, layer_table
    from remote_payload.inputs.cache import atomic_write_json
    from remote_payload.models.kernels import triton_interpreter
    from remote_payload.results import now_utc, versions

    if not triton_interpreter():
        raise SystemExit("record-cpu-figures runs fla's kernels through Triton's CPU interpreter: run it with "
                         "<fla-venv>/bin/python tests/fla_cpu/bootstrap.py -m remote_payload.diagnose.gpu_kit ...")
    import torch

    torch.set_num_threads(1)
    with private_tmp("dfo-gpu-kit-cpu-") as work:
        kit_fixtures.build(Path(work), ["target"])
        tables = {d: layer_table(str(Path(work) / "target"), d, "cpu", "fla", TABLE_NEW_TOKENS["gpu"])
                  for d in DTYPES}
    source = {"command": "<fla-venv>/bin/python tests/fla_cpu/bootstrap.py -m remote_payload.diagnose.gpu_kit "
                         "record-cpu-figures --out remote_payload/diagnose/gpu_kit/data/cpu_interpreter_figures.json",
              "recorded": now_utc(), "versions": versions(),
              "kernels": "fla's Triton kernels on Triton's CPU interpreter, patched by tests/fla_cpu/shim.py"}
    atomic_write_json(Path(args.out), {"source": source, "tables": tables})
    print(json.dumps({d: max(r["relative"] for r in t["per_layer"]) for d, t in tables.items()}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="remote_payload.diagnose.gpu_kit", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("step", help="run one step, writing its figures to --part as they come")
    s.add_argument("name", choices=STEPS)
    s.add_argument("--part", required=True)
    s.add_argument("--mode", choices=tuple(DEFAULTS), default="gpu")
    s.add_argument("--device", choices=("cuda", "cpu"))
    s.add_argument("--kernel", choices=("fla", "torch", "auto"))
    s.set_defaults(func=run_step)
    m = sub.add_parser("merge", help="assemble the parts into one JSON (and a markdown summary)")
    m.add_argument("--parts", required=True)
    m.add_argument("--mode", choices=tuple(DEFAULTS), default="gpu")
    m.add_argument("--started", type=float)
    m.add_argument("--out", required=True)
    m.add_argument("--md")
    m.set_defaults(func=run_merge)
    r = sub.add_parser("record-cpu-figures", help="the per-layer tables through Triton's CPU interpreter")
    r.add_argument("--out", required=True)
    r.set_defaults(func=record_cpu_figures)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
