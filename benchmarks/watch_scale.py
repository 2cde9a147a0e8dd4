"""How `dfo watch`'s controller-side costs grow with the series, and what a checkpoint costs in the demo.

    .venv/bin/python benchmarks/watch_scale.py [--sizes 10,100,250,500,1000] [--out FILE.json]
    .venv/bin/python benchmarks/watch_scale.py --demo [--samples 6]   # the sandbox demo, with and without
                                                                       # the resident worker (needs sshd)

Scale: a synthetic series (entries of the shape the watcher writes: measures with CIs, a verdict, p1..p4,
per-dataset τ) is fed through every reader and writer at each size N: one update as the watcher now makes
it (a journal line), one update as it made it before (series.json rewritten whole), reading the series
back (series.json + journal), `series show` (the summary and the latest 30 rows; and --all), series.md, and
tau_vs_step.png (all checkpoints; and --plot-last 100). Each figure is the median of a few repeats, in ms.

Demo: `dfo demo --watch` twice in one process, the resident workers off then on (the eval worker on ct129 and
the strip worker on kpro6), and per checkpoint the wall time from the start of its attempt to its record,
split into relay + launch (the strip on the training host included), the eval host's part (the whole job,
or the worker's), and the rest (follow, pull, report, series update); medians and ranges.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _entry(step: int, tau: float) -> dict:
    def stat(v: float) -> dict:
        return {"value": round(v, 4), "ci": [round(v - 0.21, 4), round(v + 0.23, 4)]}

    return {"name": f"step_{step}.pt", "path": f"/data/checkpoints/run7/step_{step}.pt", "step": step,
            "step_source": "name", "status": "done", "attempts": 1, "observed": {"size": 1 << 30, "mtime": 1.7e9},
            "started_utc": "2026-01-01T00:00:00Z", "run": f"20260101-000000-ct129-{step:04x}", "superseded_runs": [],
            "drafter": f"step_{step}", "finished_utc": "2026-01-01T00:01:00Z", "strip_key": "0123456789abcdef",
            "measures": {"samples": 64, "rounds": 9000, "tau_macro": stat(tau), "tau_micro": stat(tau - 0.1),
                         "ddtree": {"k": 8, **stat(tau + 2.1)}, "p": [{"k": k, **stat(0.9 / k)} for k in range(1, 5)],
                         "conventions": {"zlab-2604": tau + 0.04, "vllm": tau + 0.08},
                         "by_dataset": {d: {"samples": 16, "tau_macro": stat(tau + i / 10)}
                                        for i, d in enumerate(("gsm8k", "math500", "humaneval", "mbpp"))}},
            "verdict": {"verdict": "flat", "against": f"step_{step - 100}.pt", "delta": 0.01, "ci": [-0.05, 0.07],
                        "regression": False, "plateau": False, "paired_samples": 64},
            "digests": {"source": {"sha256": "ab" * 32}, "relayed": {"model.safetensors": "cd" * 32}},
            "timings": {"relay_launch_s": 40.0, "total_s": 95.0}, "reuse": {"features_cache_hits": 64},
            "removed_from_eval_host": True, "metadata_step": step}


def _ms(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def scale(sizes: list[int]) -> list[dict]:
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(_one_size(n, Path(tmp)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _one_size(n: int, folder: Path) -> dict:
    from rich.console import Console

    from orchestrator.cli.series_cmd import SHOW_LAST, render_series
    from orchestrator.core import plotting
    from orchestrator.evaluation.runs import write_json_atomic
    from orchestrator.watch import series as series_state
    from orchestrator.watch.plot import write_plot
    from orchestrator.watch.render import series_markdown

    class Ctx:  # what render_series prints to
        def __init__(self):
            self.out = Console(file=io.StringIO(), width=160)

    s = series_state.new_series("bench", source="kpro6:/data/checkpoints/run7", eval_host="ct129",
                                settings={"target": "/data/models/Qwen3.6-27B", "samples": 64})
    for i in range(1, n + 1):
        s["checkpoints"][f"step_{100 * i}.pt"] = _entry(100 * i, 2.0 + (i % 50) / 25)
    series_state.save(folder, s)
    last = s["checkpoints"][f"step_{100 * n}.pt"]
    row: dict = {"checkpoints": n}
    row["update_journal_ms"] = _ms(lambda: series_state.record(folder, s, entry=last), repeat=9)
    row["update_rewrite_ms"] = _ms(lambda: write_json_atomic(folder / "old-series.json", s))
    row["load_ms"] = _ms(lambda: series_state.load_series(folder))
    doc = series_state.load_series(folder)
    row["show_ms"] = _ms(lambda: render_series(Ctx(), folder, doc, last=SHOW_LAST))
    row["show_all_ms"] = _ms(lambda: render_series(Ctx(), folder, doc, last=None), repeat=1)
    md = series_markdown(doc, plotted=True)
    row["markdown_ms"] = _ms(lambda: series_markdown(doc, plotted=True))
    row["markdown_kb"] = round(len(md.encode()) / 1024, 1)
    row["series_json_kb"] = round((folder / "series.json").stat().st_size / 1024, 1)
    if plotting.available():
        row["plot_ms"] = _ms(lambda: write_plot(folder, doc), repeat=1)
        row["plot_last100_ms"] = _ms(lambda: write_plot(folder, doc, last=100), repeat=1)
    return row


def demo(samples: int) -> dict:
    from orchestrator.core.events import QuietEvents
    from orchestrator.demo.watch import run_watch_demo
    from orchestrator.watch import series as series_state

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for resident in (False, True):
            outcome = run_watch_demo(events=QuietEvents(), runs_dir=Path(tmp) / "runs", samples=samples,
                                     resident=resident)
            per = []
            for e in series_state.done_entries(outcome.series):
                t = e.get("timings") or {}
                host = t.get("worker_eval_s", t.get("job_eval_s"))
                per.append({"step": e["step"], "total_s": t.get("total_s"),
                            "relay_launch_s": t.get("relay_launch_s"), "eval_host_s": host,
                            "drafter_load_s": t.get("drafter_load_s"), "resident": e.get("resident")})
            totals = [p["total_s"] for p in per if p["total_s"] is not None]
            relays = [p["relay_launch_s"] for p in per if p["relay_launch_s"] is not None]
            key = "resident" if resident else "one_job_per_checkpoint"
            out[key] = {"checkpoints": per, "median_total_s": statistics.median(totals) if totals else None,
                        "range_total_s": [min(totals), max(totals)] if totals else None,
                        "median_relay_launch_s": statistics.median(relays) if relays else None,
                        "demo_s": round(outcome.seconds, 1)}
            print(json.dumps({key: out[key]}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,100,250,500,1000")
    ap.add_argument("--demo", action="store_true", help="the sandbox demo, worker off then on")
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = demo(args.samples) if args.demo else {"scale": scale([int(n) for n in args.sizes.split(",")])}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
