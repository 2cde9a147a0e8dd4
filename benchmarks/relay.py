"""Benchmark: relaying a checkpoint kpro6 -> controller -> ct129 on the sandbox hosts.

Starts the two sandbox sshd hosts (network namespaces when run as root), writes a random file of
--size on kpro6, then, interleaved over --reps repetitions (so machine-load drift hits every method
alike), times:

  pipe        ssh kpro6 cat F | ssh ct129 'cat > F'            (default cipher)
  pipe-gcm    the same pipe with -c aes128-gcm@openssh.com
  scp3        scp -3 kpro6:F ct129:F
  scp3-gcm    scp -3 -O -c aes128-gcm@openssh.com kpro6:F ct129:F
  dfo-1       dfo relay-checkpoint --streams 1                  (sha256 at the source and the destination)
  dfo         dfo relay-checkpoint with its defaults
  dfo-seed    dfo relay-checkpoint with its defaults, from another checkout (--seed-tree DIR, e.g. a
              `git archive` of an older commit): the before/after comparison in one run
  (optional)  dfo-N: N streams; dfo-paramiko: the paramiko fallback data plane (a 512M+ file also
              crosses paramiko's own 512 MiB rekey threshold, which the relay disables)

Every timing is wall clock of the whole command (connection setup included); dfo's modules are
byte-compiled first (as in an installed package). Prints median MiB/s per
method, its ratios to `pipe`, `pipe-gcm` and `scp3-gcm`, the controller CPU seconds per GiB of each method
(user + system time of the command and the processes it waited for: its ssh children), and dfo's peak RSS
(ru_maxrss of the dfo process). The destination is
removed after each run; the source stays in the page cache for every method alike.

    .venv/bin/python benchmarks/relay.py --size 1G --reps 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.relay.plan import parse_rate  # noqa: E402
from orchestrator.testing.sandbox import Sandbox  # noqa: E402

GCM = "aes128-gcm@openssh.com"
METHODS = ("pipe", "pipe-gcm", "scp3", "scp3-gcm", "dfo-1", "dfo")


def parse_size(text: str) -> int:
    value = parse_rate(text)
    assert value is not None
    return int(value)


def _human(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"


def make_file(path: Path, size: int) -> None:
    block = 16 << 20
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(block, left)
            fh.write(os.urandom(n))
            left -= n


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def run_timed(argv: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, int, str, float]:
    """(seconds, peak RSS in bytes of that process, stdout, CPU seconds of it and its waited-for
    children); raises on failure."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    # wait4 gives this child's own rusage (ru_maxrss of it and its waited-for descendants: dfo itself,
    # its ssh children are a few MiB each).
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return seconds, usage.ru_maxrss * 1024, out.decode(), usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="file size (e.g. 512M, 1G; default 1G)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every method (default 3)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"comma list from {','.join(METHODS)} (or dfo-N for N streams)")
    ap.add_argument("--root", help="sandbox directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    ap.add_argument("--seed-tree", help="another checkout of dfo: adds the method dfo-seed (its defaults)")
    args = ap.parse_args()
    size = parse_size(args.size)
    methods = [m for m in args.methods.split(",") if m]
    if args.seed_tree and "dfo-seed" not in methods:
        methods.append("dfo-seed")
    unknown = {m for m in methods if m not in METHODS and m not in ("dfo-paramiko", "dfo-seed")
               and not (m.startswith("dfo-") and m[4:].isdigit())}
    if unknown:
        ap.error(f"unknown methods: {', '.join(sorted(unknown))}")

    # dfo's modules byte-compiled, as an installed package has them: this sandbox sets PYTHONDONTWRITEBYTECODE,
    # which would otherwise make every dfo start compile its modules from source (~0.1 s of CPU).
    for tree in filter(None, (str(ROOT), args.seed_tree)):
        subprocess.run([sys.executable, "-m", "compileall", "-q", "orchestrator"], cwd=tree, check=True)
    tmp = tempfile.TemporaryDirectory(prefix="dfo-bench-relay-") if not args.root else None
    root = Path(args.root or tmp.name)
    dfo = [sys.executable, "-m", "orchestrator"]
    with Sandbox(root) as box:
        print(box.summary(), file=sys.stderr)
        src_dir, dst_dir = box.hosts["kpro6"].checkpoints, box.hosts["ct129"].checkpoints
        src = src_dir / "bench.bin"
        dst = dst_dir / "bench.bin"
        print(f"writing {_human(size)} of random data to {src}", file=sys.stderr)
        make_file(src, size)
        expected_sha = sha256_of(src)
        cfg = str(box.ssh_config_path)
        env = dict(os.environ, DFO_INVENTORY=str(box.inventory_path))

        def cmd(method: str) -> list[str]:
            if method in ("pipe", "pipe-gcm"):
                c = f"-c {GCM} " if method == "pipe-gcm" else ""
                pipe = (f"ssh -F {shlex.quote(cfg)} {c}kpro6 {shlex.quote('cat ' + shlex.quote(str(src)))} | "
                        f"ssh -F {shlex.quote(cfg)} {c}ct129 {shlex.quote('cat > ' + shlex.quote(str(dst)))}")
                return ["bash", "-o", "pipefail", "-c", pipe]
            if method == "scp3":
                return ["scp", "-q", "-3", "-F", cfg, f"kpro6:{src}", f"ct129:{dst}"]
            if method == "scp3-gcm":
                return ["scp", "-q", "-3", "-O", "-c", GCM, "-F", cfg, f"kpro6:{src}", f"ct129:{dst}"]
            if method == "dfo-paramiko":
                extra = ["--data-plane", "paramiko"]
            elif method == "dfo-seed":
                extra = []
            else:
                extra = ["--streams", method[4:]] if method.startswith("dfo-") else []
            return [*dfo, "relay-checkpoint", f"kpro6:{src}", f"ct129:{dst}", "--json", *extra]

        def clean() -> None:
            for p in dst_dir.iterdir():
                p.unlink()

        times: dict[str, list[float]] = {m: [] for m in methods}
        cpu: dict[str, list[float]] = {m: [] for m in methods}
        rss: dict[str, list[int]] = {m: [] for m in methods if m.startswith("dfo")}
        details: dict[str, list[dict]] = {m: [] for m in methods if m.startswith("dfo")}
        load_before = os.getloadavg()
        for rep in range(args.reps):
            for method in methods:
                clean()
                seconds, peak, out, cpu_s = run_timed(cmd(method), env=env,
                                                      cwd=args.seed_tree if method == "dfo-seed" else str(ROOT))
                times[method].append(seconds)
                cpu[method].append(cpu_s)
                if method.startswith("dfo"):
                    rss[method].append(peak)
                    summary = json.loads(out)
                    details[method].append({k: summary[k] for k in ("streams", "cipher", "mib_per_s", "seconds",
                                                                    "data_plane")})
                    assert summary["sha256"] and summary["digests"]["source"] == summary["digests"]["destination"]
                    assert summary["sha256"] == expected_sha
                elif dst.stat().st_size != size:
                    raise RuntimeError(f"{method}: destination has {dst.stat().st_size} bytes, expected {size}")
                print(f"rep {rep + 1} {method:9} {size / 2**20 / seconds:7.1f} MiB/s ({seconds:.2f}s, "
                      f"controller CPU {cpu_s:.2f}s, load {os.getloadavg()[0]:.2f})", file=sys.stderr)
        clean()
        load_after = os.getloadavg()

    mib = size / 2**20
    gib = size / 2**30
    med = {m: mib / statistics.median(t) for m, t in times.items()}
    cpu_gib = {m: statistics.median(c) / gib for m, c in cpu.items()}
    print(f"\nrelay benchmark: {_human(size)}, {args.reps} interleaved repetitions, medians "
          f"(load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} CPUs)")
    refs = [r for r in ("pipe", "pipe-gcm", "scp3-gcm") if r in med]
    head = "".join(f" {'vs ' + r:>12}" for r in refs)
    # A small file's figure is its wall time (the fixed cost), so the table shows both.
    print(f"{'method':10} {'MiB/s':>8} {'wall s':>7}{head} {'CPU s/GiB':>10}  all runs (wall s)")
    for m in methods:
        ratios = "".join(f" {med[m] / med[r]:11.2f}x" for r in refs)
        runs = ", ".join(f"{t:.2f}" for t in times[m])
        print(f"{m:10} {med[m]:8.1f} {statistics.median(times[m]):7.2f}{ratios} {cpu_gib[m]:10.2f}  {runs}")
    for m, peaks in rss.items():
        print(f"{m}: peak RSS {max(peaks) / 2**20:.0f} MiB; {details[m][0]['streams']} stream(s), "
              f"cipher {details[m][0]['cipher']}, {details[m][0]['data_plane']}")
    if "dfo" in med:
        for ref, target in (("scp3-gcm", 0.9), ("pipe-gcm", 0.9), ("pipe", 1.2), ("dfo-seed", None)):
            if ref in med:
                goal = f" (target >= {target})" if target else ""
                print(f"dfo / {ref} = {med['dfo'] / med[ref]:.2f}{goal}; wall time "
                      f"{statistics.median(times[ref]):.2f}s vs dfo {statistics.median(times['dfo']):.2f}s")
        if "pipe-gcm" in cpu_gib:
            print(f"dfo controller CPU / pipe-gcm's = {cpu_gib['dfo'] / cpu_gib['pipe-gcm']:.2f} (target <= 1.1)")
    if args.json:
        print(json.dumps({"size": size, "reps": args.reps, "median_mib_s": med, "runs_s": times, "cpu_s": cpu,
                          "cpu_s_per_gib": cpu_gib, "peak_rss": rss, "dfo": details,
                          "load": [load_before, load_after]}, indent=2))
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
