"""Engine figures of a sharded eval (``--engine NAME`` on several hosts), merged like the offline metrics.

Each host ran its own engine servers on its slice of the prompts, so the run-wide figures are recomputed
over all samples: the engine's per-request figures (and per-step lists) and the offline ``vllm``-convention
rounds both travel in samples.jsonl (``drafters[NAME].engine`` and ``drafters[NAME].conventions``), and the
agreement is the payload's own comparison (``remote_payload.metrics.engine_agreement``) over the union: its
bounds follow from the union's differing rounds, so they are not the hosts' bounds combined. The
concurrency table is summed per level: tokens over the hosts' seconds (as if the slices ran one after
another, like the baseline), mismatches listed together; the hosts' counter cross-checks are kept per host
and must all hold. Per-host server facts (start seconds, logs, versions) are kept under ``engine.hosts``.
The figures came from the hosts: a drafter whose figures are missing or not numbers gets an ``error``
instead of a merged block (the run's other figures stand).

At T > 0 (the hosts' blocks say ``sampled``) outputs are draws, not compared with the references: the agreement is
the payload's expectation test (``metrics.sampled.sampled_engine_agreement``) over every host's draws, clustered by
prompt (``prompt_index`` of each sample line), with the hosts' greedy probes summed.
"""

from __future__ import annotations

from remote_payload.engines import registry as engine_registry
from remote_payload.metrics.engine_agreement import compare, engine_figures, per_step_differences
from remote_payload.metrics.sampled import sampled_engine_agreement

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
    engine = next((r["engine"].get("name") for r in host_results.values() if isinstance(r.get("engine"), dict)),
                  None) or "vllm"
    try:
        return _merge_drafter(name, host_results, samples)
    except KeyError as exc:
        return {"engine": engine, "error": f"the hosts' engine figures of {name!r} cannot be merged: no {exc} field"}
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # int() of a host's inf: OverflowError
        return {"engine": engine, "error": f"the hosts' engine figures of {name!r} cannot be merged: {exc}"}


def _merged_levels(tables: list[list[dict]]) -> list[dict]:
    """The hosts' speedup tables summed per level (levels every host ran): tokens/s = tokens / seconds."""
    common = set.intersection(*({r["concurrency"] for r in t} for t in tables)) if tables else set()
    out = []
    for c in sorted(common):
        rows = [next(r for r in t if r["concurrency"] == c) for t in tables]
        plain = _rate(sum(r["plain_tokens"] for r in rows), sum(r["plain_seconds"] for r in rows))["tokens_per_s"] \
            if all(_counted(r, "plain") for r in rows) else None
        dflash = _rate(sum(r["dflash_tokens"] for r in rows), sum(r["dflash_seconds"] for r in rows))["tokens_per_s"] \
            if all(_counted(r, "dflash") for r in rows) else None
        taus = [(r["mean_acceptance_length"], r["samples"]) for r in rows if r.get("mean_acceptance_length")]
        out.append({"concurrency": c, "plain_tokens_per_s": plain, "dflash_tokens_per_s": dflash,
                    "speedup": round(dflash / plain, 3) if plain and dflash else None,
                    "mean_acceptance_length": sum(t * n for t, n in taus) / sum(n for _, n in taus) if taus else None,
                    "tpot_ms": {k: _mean([(r["tpot_ms"] or {}).get(k) for r in rows]) for k in ("plain", "dflash")},
                    "samples": sum(r["samples"] for r in rows),
                    "reference_mismatches": {k: _joined([(r["reference_mismatches"] or {}).get(k) for r in rows])
                                             for k in ("plain", "dflash")},
                    "equal_plain": None if any(r.get("equal_plain") is None for r in rows)
                    else all(r["equal_plain"] for r in rows)})
    return out


def _counted(row: dict, side: str) -> bool:
    return isinstance(row.get(f"{side}_tokens"), int) and isinstance(row.get(f"{side}_seconds"), (int, float))


def _mean(values: list) -> float | None:
    nums = [v for v in values if isinstance(v, (int, float))]
    return round(sum(nums) / len(nums), 3) if len(nums) == len(values) and nums else None


def _joined(lists: list) -> list | None:
    return None if any(x is None for x in lists) else [i for x in lists for i in x]


def _merged_checks(checks: dict[str, dict]) -> dict:
    return {"ok": all(c.get("ok") for c in checks.values()), "hosts": checks,
            "requests": sum(c.get("requests") or 0 for c in checks.values()),
            "concurrency": next(iter(checks.values())).get("concurrency"),
            "counters": {k: sum(c.get("counters", {}).get(k) or 0 for c in checks.values())
                         for k in ("rounds", "drafts_accepted")},
            "differ": sorted({d for c in checks.values() for d in c.get("differ") or []})}


def _merge_drafter(name: str, host_results: dict[str, dict], samples: list[dict]) -> dict:
    found = {h: ((r.get("drafters") or {}).get(name) or {}).get("engine") for h, r in host_results.items()}
    failed = {h: (b or {}).get("error") or "not run there" for h, b in found.items() if not b or b.get("error")}
    per_host: dict[str, dict] = {h: b for h, b in found.items() if b}
    engine = next((b.get("engine") for b in per_host.values() if b.get("engine")), "vllm")
    if failed:
        return {"engine": engine, "error": "; ".join(f"{h}: {e}" for h, e in failed.items())}
    positions = next(iter(per_host.values()))["num_speculative_tokens"]
    if any(b.get("sampled") for b in per_host.values()):
        return _merge_sampled(name, str(engine), positions, per_host, host_results, samples)
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
    agreement["per_step"] = per_step_differences([sid for sid, _, _ in kept], [e.get("per_step") for _, e, _ in kept],
                                                 [o for o, _ in offline])
    checks: dict[str, dict] = {h: b["counter_check"] for h, b in per_host.items()
                               if isinstance(b.get("counter_check"), dict)}
    return {"engine": engine, "num_speculative_tokens": positions, "samples": eng,
            "total": engine_figures(eng, positions),
            "outputs": {"samples": len(eng), "match_reference": len(kept), "mismatches": mismatches,
                        "equal_plain": None if None in equal_plain else all(equal_plain)},
            "tokens_per_s": {"plain": plain_tps, "dflash": dflash,
                             "speedup": round(dflash / plain_tps, 3) if dflash and plain_tps else None},
            "agreement": agreement, "exported": next(iter(per_host.values())).get("exported"),
            "concurrency": _merged_levels([b.get("concurrency") or [] for b in per_host.values()]),
            "counter_check": _merged_checks(checks) if checks else None,
            "hosts": {h: {k: b.get(k) for k in ("folder", "server", "tokens_per_s")} for h, b in per_host.items()}}


def _merge_sampled(name: str, engine: str, positions: int, per_host: dict[str, dict], host_results: dict[str, dict],
                   samples: list[dict]) -> dict:
    """A drafter's engine block at T > 0 over every host: the draws' figures and the expectation test."""
    lines = [line for line in samples if "engine" in (line.get("drafters") or {}).get(name, {})]
    eng = [{"id": line["id"], **line["drafters"][name]["engine"]} for line in lines]
    offline = [_offline_accepted(line["drafters"][name]) for line in lines]
    clusters = [int(line["prompt_index"]) for line in lines]
    firsts = [b["agreement"] for b in per_host.values()]
    probes = [a.get("greedy_probe") for a in firsts]
    greedy = None if any(not isinstance(g, dict) for g in probes) else \
        {k: sum(int(g.get(k) or 0) for g in probes) for k in ("requests", "rounds", "drafts_accepted")}
    devices = {str((host_results[h].get("settings") or {}).get("device")) for h in per_host}
    known = engine_registry.ENGINES.get(engine)
    title = known.title if known else engine
    agreement = sampled_engine_agreement([o for o, _ in offline], eng, clusters, title=title, law=firsts[0]["law"],
                                         device=devices.pop() if len(devices) == 1 else "mixed", greedy=greedy)
    agreement["offline_source"] = CONVENTION if all(ok for _, ok in offline) else COMMITTED
    plain = [(host_results[h].get("engine") or {}).get("plain") or {} for h in per_host]
    dflash = _rate(sum(e["tokens"] for e in eng), sum(e["seconds"] for e in eng))["tokens_per_s"]
    plain_tps = _rate(sum(p.get("tokens") or 0 for p in plain),
                      sum(p.get("seconds") or 0 for p in plain))["tokens_per_s"]
    checks: dict[str, dict] = {h: b["counter_check"] for h, b in per_host.items()
                               if isinstance(b.get("counter_check"), dict)}
    return {"engine": engine, "num_speculative_tokens": positions, "sampled": True, "samples": eng,
            "total": engine_figures(eng, positions),
            "outputs": {"samples": len(eng), "match_reference": None, "mismatches": None,
                        "note": next(iter(per_host.values())).get("outputs", {}).get("note")},
            "tokens_per_s": {"plain": plain_tps, "dflash": dflash,
                             "speedup": round(dflash / plain_tps, 3) if dflash and plain_tps else None},
            "agreement": agreement, "exported": next(iter(per_host.values())).get("exported"),
            "concurrency": _merged_levels([b.get("concurrency") or [] for b in per_host.values()]),
            "counter_check": _merged_checks(checks) if checks else None,
            "hosts": {h: {k: b.get(k) for k in ("folder", "server", "tokens_per_s")} for h, b in per_host.items()}}
