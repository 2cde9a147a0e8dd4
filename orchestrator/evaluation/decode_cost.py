"""The expected cost of an eval's reference stage on a host, from that host's GPU-check figures (pure).

A host's figures are the ``gpu-check.json`` that ``scripts/gpu-check.sh`` (or the payload's ``gpu_kit``) wrote on
it, kept on the controller and named by the host's ``gpu_check:`` in the inventory (docs/gpu-hosts.md). Its
``cost`` step measured decode tokens/s per batch on the random real-size target (``batched_decode.by_batch``,
and ``decode`` at batch 1). The reference stage decodes every row — a greedy reference, or at T > 0 each draw —
up to ``max_new_tokens`` plus its tail: at most ``rows × (max_new + tail)`` tokens, at the rate of the batch the
run will use (``--decode-batch N``: the largest measured batch not above N; ``auto``: the largest measured).
An upper bound: a row that stops early costs less, and the prefills (extraction-speed forwards) are left out.
Pure but for ``read_gpu_check``, which reads the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

TAIL_ESTIMATE = 15  # tokens past the stop per row: a block of 16 less its anchor (z-lab's DFlash drafters)


def read_gpu_check(inventory, host: str) -> tuple[dict | None, str | None]:
    """The host's gpu-check.json (inventory ``gpu_check:``, relative to the inventory file), or why there is none."""
    name = inventory.hosts[host].gpu_check
    if not name:
        return None, ("no GPU-check figures (give the host `gpu_check: FILE`, a copy of the gpu-check.json "
                      "scripts/gpu-check.sh wrote there; docs/gpu-hosts.md)")
    path = Path(name).expanduser()
    path = path if path.is_absolute() else Path(inventory.source).resolve().parent / path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"gpu_check {path}: cannot read it ({type(exc).__name__}: {exc})"
    return (data, None) if isinstance(data, dict) else (None, f"gpu_check {path}: not a JSON object")


def decode_rates(figures: Any) -> dict[int, float]:
    """Tokens/s by batch from a gpu-check.json document (batch 1 from ``decode`` when no batch 1 was measured);
    anything malformed is left out (the file is the host's)."""
    sections = _get(figures, "steps", "cost", "sections")
    out: dict[int, float] = {}
    for batch, entry in (_get(sections, "batched_decode", "by_batch") or {}).items():
        rate = _get(entry, "tokens_per_s")
        if str(batch).isdigit() and _positive(rate):
            out[int(batch)] = float(rate)
    single = _get(sections, "decode", "tokens_per_s")
    if 1 not in out and _positive(single):
        out[1] = float(single)
    return out


def reference_cost(rates: dict[int, float], rows: int, max_new_tokens: int, tail: int,
                   decode_batch: str | int | None) -> dict | None:
    """Seconds (an upper bound) of the reference stage for ``rows`` rows, or None without a usable rate."""
    if not rates or rows <= 0:
        return None
    wanted = None if decode_batch is None or decode_batch == "auto" else int(decode_batch)
    usable = [b for b in rates if wanted is None or b <= wanted] or [min(rates)]
    batch = max(usable)
    tokens = rows * (max_new_tokens + tail)
    return {"batch": batch, "tokens_per_s": rates[batch], "rows": rows, "tokens": tokens,
            "seconds": tokens / rates[batch]}


def rows_per_host(prompts: int | None, hosts: int, samples_per_prompt: int | None) -> int | None:
    """The rows the busiest host decodes: its share of the prompts, times the draws per prompt."""
    if prompts is None:
        return None
    return math.ceil(prompts / max(hosts, 1)) * (samples_per_prompt or 1)


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
