"""The z-lab suite's wall time and cache size on this GPU, projected from the ``cost`` step's rates. Pure.

Per sample the eval (one drafter) costs, stage by stage (remote_payload/eval/stages.py):
- reference: the prompt's prefill, ``max_new`` greedy tokens, then the tail the zlab-2604/vllm conventions read: a
  fresh prefill of prompt + continuation and ``block_size - 1`` more greedy tokens;
- extraction: one forward over prompt + continuation;
- drafter eval: the draft pass at every continuation position with the tree replays (the eval's own pass).
Prefills are counted at the extraction rate (the same forward, less the argmax head); greedy tokens at the
measured seconds per token after a prefill of ``decode_context`` (about the middle of a 2,048-token answer).
Token counts are ``data/zlab_suite_tokens.json``'s: every response runs to max-new, so this is an upper bound
(a response that stops early costs less). The cache holds each sample's features plus 16 B per token.
``by_batch``: the same with the decode rate of each batch the ``batched_decode`` section measured, for the suite
and for one set of draws of the card protocol (``CARD``; at T > 0 the sampling on the CPU adds to it, unmeasured).
"""

from __future__ import annotations

import json
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "data" / "zlab_suite_tokens.json"


def suite() -> dict:
    return json.loads(SUITE.read_text())


# The DFlash2 card's protocol (eval/protocols.py): GSM8K, 128 prompts, up to 4,096 new tokens, T = 1.
CARD = {"dataset": "gsm8k", "samples": 128, "max_new_tokens": 4096}


def rates_from(cost: dict, batch: int | None = None) -> dict:
    """The rates a projection needs, from the cost step's sections; a missing one is None. ``batch``: decode at
    that many rows per forward (the ``batched_decode`` section's rate) instead of one prompt at a time."""
    ex, dec, dr, sizes = (cost.get(k) or {} for k in ("extraction", "decode", "drafter", "sizes"))
    if batch is not None:
        rate = (((cost.get("batched_decode") or {}).get("by_batch") or {}).get(str(batch)) or {}).get("tokens_per_s")
        dec = {"seconds_per_token": 1 / rate if rate else None}
    return {"extraction_tokens_per_s": ex.get("tokens_per_s"), "decode_seconds_per_token": dec.get("seconds_per_token"),
            "drafter_tokens_per_s": (dr.get("ddtree") or {}).get("tokens_per_s"),
            "block_size": dr.get("block_size"), "cache_file_bytes_per_token": sizes.get("cache_file_bytes_per_token")}


def project(rates: dict, table: dict) -> dict:
    """Seconds per stage and cache bytes per dataset and in total; a stage whose rate is missing is None."""
    max_new = table["max_new_tokens"]
    ex_rate, s_tok = rates.get("extraction_tokens_per_s"), rates.get("decode_seconds_per_token")
    dr_rate, per_tok = rates.get("drafter_tokens_per_s"), rates.get("cache_file_bytes_per_token")
    tail = (rates.get("block_size") or 16) - 1
    per_dataset = {}
    totals: dict[str, float | None] = {"reference_s": 0.0, "extraction_s": 0.0, "drafter_eval_s": 0.0,
                                       "cache_bytes": 0}
    for name, d in table["datasets"].items():
        n, seq = d["samples"], d["tokens"]
        new = n * max_new
        prompt = seq - new
        row = {"samples": n, "sequence_tokens": seq, "new_tokens": new,
               "reference_s": (prompt + seq) / ex_rate + (new + n * tail) * s_tok if ex_rate and s_tok else None,
               "extraction_s": seq / ex_rate if ex_rate else None,
               "drafter_eval_s": new / dr_rate if dr_rate else None,
               "cache_bytes": seq * per_tok if per_tok else None}
        per_dataset[name] = row
        for key in totals:
            totals[key] = None if totals[key] is None or row[key] is None else totals[key] + row[key]
    stages = [totals["reference_s"], totals["extraction_s"], totals["drafter_eval_s"]]
    known = [v for v in stages if v is not None]
    total_s = sum(known) if len(known) == len(stages) else None
    return {"upper_bound": True, "max_new_tokens": max_new, "rates": rates, "per_dataset": per_dataset,
            "total": {**totals, "total_s": total_s, "hours": None if total_s is None else total_s / 3600,
                      "cache_gib": None if totals["cache_bytes"] is None else totals["cache_bytes"] / 2**30}}


def card_table(table: dict) -> dict:
    """The card protocol as a suite table: GSM8K's prompts (their mean length from ``table``) at 4,096 new tokens."""
    g = table["datasets"][CARD["dataset"]]
    prompt = g["tokens"] / g["samples"] - table["max_new_tokens"]
    n, new = CARD["samples"], CARD["max_new_tokens"]
    return {"max_new_tokens": new, "datasets": {CARD["dataset"]: {"samples": n, "tokens": round(n * (prompt + new))}}}


def by_batch(cost: dict, table: dict) -> dict:
    """Hours of the z-lab suite and of one set of the card protocol's draws at each measured decode batch."""
    measured = ((cost.get("batched_decode") or {}).get("by_batch") or {})
    out = {}
    for b in sorted(measured, key=int):
        rates = rates_from(cost, int(b))
        out[b] = {"decode_tokens_per_s": measured[b].get("tokens_per_s"),
                  "cuda_peak_bytes": measured[b].get("cuda_peak_bytes"),
                  "zlab_suite_hours": project(rates, table)["total"]["hours"],
                  "card_protocol_hours": project(rates, card_table(table))["total"]["hours"]}
    return out
