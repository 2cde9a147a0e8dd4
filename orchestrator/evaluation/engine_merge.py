"""Engine figures of a sharded eval (``--engine vllm`` on several hosts), merged like the offline metrics.

Each host ran its own vLLM servers on its slice of the prompts, so the run-wide figures are recomputed
over all samples: the engine's per-sample counters and the offline ``vllm``-convention rounds both travel in
samples.jsonl (``drafters[NAME].engine`` and ``drafters[NAME].conventions``), and the agreement is the
payload's own comparison (``remote_payload.metrics.engine_agreement``) over the union: its bounds follow from
the union's differing rounds, so they are not the hosts' bounds combined. Per-host server facts (start
seconds, logs, versions) are kept under ``engine.hosts``. The figures came from the hosts: a drafter whose
figures are missing or not numbers gets an ``error`` instead of a merged block (the run's other figures stand).
"""

from __future__ import annotations

from remote_payload.metrics.engine_agreement import compare, engine_figures

CONVENTION = "vllm"
COMMITTED = "committed (the vllm convention's rounds; the last round capped at the kept tokens, a lower bound there)"


def merge_engine(host_results: dict[str, dict], samples: list[dict]) -> tuple[dict | None, dict[str, dict]]:
    """(results.engine, {drafter: drafters[NAME].engine}) over every host; (None, {}) without engine blocks."""
    blocks = {h: r["engine"] for h, r in host_results.items() if r.get("engine")}
    if not blocks:
        return None, {}
    names = list(dict.fromkeys(n for r in host_results.values() for n, d in (r.get("drafters") or {}).items()
                               if d.get("engine")))
    drafters = {name: _merged_or_error(name, host_results, samples) for name in names}
    plain = [b.get("plain") for b in blocks.values()]
    first = next(iter(blocks.values()))
    run = {"name": first.get("name"), "version": first.get("version"), "used_for": first.get("used_for"),
           "plain": _rate(sum(p["tokens"] for p in plain), sum(p["seconds"] for p in plain))
           if all(p and p.get("seconds") for p in plain) else None,
           "start_seconds": {f"{h}:{k}": v for h, b in blocks.items()
                             for k, v in (b.get("start_seconds") or {}).items()},
           "logs": [f"{h}-{log}" for h, b in blocks.items() for log in b.get("logs") or []],
           "hosts": blocks}
    versions = {b.get("version") for b in blocks.values()}
    if len(versions) > 1:
        run["version"] = " / ".join(sorted(str(v) for v in versions))
    errors = [f"{h}: {b['error']}" for h, b in blocks.items() if b.get("error")]
    if errors:
        run["error"] = "; ".join(errors)
    return run, drafters


def _rate(tokens: int, seconds: float) -> dict:
    return {"tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2) if seconds else None}


def _offline_accepted(entry: dict) -> tuple[list[int], bool]:
    conv = (entry.get("conventions") or {}).get(CONVENTION)
    if isinstance(conv, dict) and isinstance(conv.get("accepted"), list):
        return list(conv["accepted"]), True
    return list(entry.get("accepted") or []), False


def _merged_or_error(name: str, host_results: dict[str, dict], samples: list[dict]) -> dict:
    try:
        return _merge_drafter(name, host_results, samples)
    except KeyError as exc:
        return {"engine": "vllm", "error": f"the hosts' engine figures of {name!r} cannot be merged: no {exc} field"}
    except (TypeError, ValueError) as exc:
        return {"engine": "vllm", "error": f"the hosts' engine figures of {name!r} cannot be merged: {exc}"}


def _merge_drafter(name: str, host_results: dict[str, dict], samples: list[dict]) -> dict:
    found = {h: ((r.get("drafters") or {}).get(name) or {}).get("engine") for h, r in host_results.items()}
    failed = {h: (b or {}).get("error") or "not run there" for h, b in found.items() if not b or b.get("error")}
    per_host: dict[str, dict] = {h: b for h, b in found.items() if b}
    if failed:
        return {"engine": "vllm", "error": "; ".join(f"{h}: {e}" for h, e in failed.items())}
    positions = next(iter(per_host.values()))["num_speculative_tokens"]
    rows = [(line["id"], line["drafters"][name]) for line in samples
            if "engine" in (line.get("drafters") or {}).get(name, {})]
    eng = [{"id": sid, **entry["engine"]} for sid, entry in rows]
    kept = [(sid, e, entry) for (sid, entry), e in zip(rows, eng, strict=True) if e.get("matches_reference")]
    offline = [_offline_accepted(entry) for _, _, entry in kept]
    agreement = compare([sid for sid, _, _ in kept], [e for _, e, _ in kept], [o for o, _ in offline], positions)
    agreement.update(convention=CONVENTION, offline_source=CONVENTION if all(ok for _, ok in offline) else COMMITTED,
                     left_out=[e["id"] for e in eng if not e.get("matches_reference")])
    plain = [(host_results[h].get("engine") or {}).get("plain") or {} for h in per_host]
    dflash = _rate(sum(e["tokens"] for e in eng), sum(e["seconds"] for e in eng))["tokens_per_s"]
    plain_tps = _rate(sum(p.get("tokens") or 0 for p in plain),
                      sum(p.get("seconds") or 0 for p in plain))["tokens_per_s"]
    mismatches = [m for b in per_host.values() for m in (b.get("outputs") or {}).get("mismatches") or []]
    equal_plain = [(b.get("outputs") or {}).get("equal_plain") for b in per_host.values()]
    return {"engine": "vllm", "num_speculative_tokens": positions, "samples": eng,
            "total": engine_figures(eng, positions),
            "outputs": {"samples": len(eng), "match_reference": len(kept), "mismatches": mismatches,
                        "equal_plain": None if None in equal_plain else all(equal_plain)},
            "tokens_per_s": {"plain": plain_tps, "dflash": dflash,
                             "speedup": round(dflash / plain_tps, 3) if dflash and plain_tps else None},
            "agreement": agreement, "exported": next(iter(per_host.values())).get("exported"),
            "hosts": {h: {k: b.get(k) for k in ("folder", "server", "tokens_per_s")} for h, b in per_host.items()}}
