"""Merge the results of several eval hosts that each evaluated a slice of the prompts. Pure stdlib.

The controller (orchestrator/evaluation/merge.py) calls ``merge_shards`` with each host's (results.json,
samples.jsonl lines). Parts must come from the same evaluation: same target weights, same drafters
(normalised spec and checkpoint digest) and the same settings except those that name the slice
(``SHARD_KEYS``); anything else is refused with a message naming the part and the field. Every metric is
recomputed from the per-sample records (averaging per-host averages would weight hosts, not samples):
chain metrics via ``chain.summarize``, tree metrics via ``tree.tree_summary``, the τ conventions via
``conventions.summaries`` (from each sample's zlab-2604/vllm records and ``tail_tokens``), the online-check
summary and the drafter comparison. Parts of results schema ``dfo.results/1`` are read as the current layout
(``migrate.py``). Per-shard provenance (shard, sample ids, timings, versions, kernel path,
device, target path, drafter sources and timings) is kept under ``results["shards"]``.
"""

from __future__ import annotations

import time
from typing import Sequence

from remote_payload.errors import PayloadError
from remote_payload.metrics import conventions as conv
from remote_payload.metrics import migrate
from remote_payload.metrics.by_k import summarize_by_k
from remote_payload.metrics.chain import summarize
from remote_payload.metrics.compare import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, compare_drafters
from remote_payload.metrics.depth import by_context_depth
from remote_payload.metrics.sample_rounds import rounds_from_entry
from remote_payload.metrics.sampled import cluster_sums, clusters_of, online_summary, sampled_figures
from remote_payload.metrics.sampled_rule import rule_summary
from remote_payload.metrics.stats import bootstrap_cis, bootstrap_mean_ci, verdict
from remote_payload.metrics.tree import tree_summary

# settings that legitimately differ between the parts of one sharded eval (the slice, and host-local paths)
SHARD_KEYS = ("samples", "sample_ids", "shard", "cache_dir", "device")
# top-level keys merged field by field below; any other key is kept when equal in all parts, else per shard
_MERGED_KEYS = {"schema", "status", "created_utc", "settings", "target", "versions", "reference", "extraction",
                "drafters", "timings", "samples", "comparison", "warnings", "shards", "merge", "diagnostics"}


def merge_shards(parts: Sequence[tuple[dict, list[dict]]]) -> tuple[dict, list[dict]]:
    """(results, samples) of every part -> one (results, samples) over all their samples, in prompt order."""
    if not parts:
        raise PayloadError("merge: no parts to merge")
    _check_compatible([r for r, _ in parts])  # one schema in all parts, then read as the current layout
    parts = [(migrate.results(r), [migrate.sample_line(line) for line in s]) for r, s in parts]
    results_list = [r for r, _ in parts]
    first = results_list[0]
    samples = _merge_samples(parts)
    names = list(first.get("drafters") or {})
    shard_count = (first.get("settings") or {}).get("shard", {}).get("count")
    indices = sorted((r.get("settings") or {}).get("shard", {}).get("index") for r in results_list)
    kernel_paths = _distinct((r.get("extraction") or {}).get("kernel_path") for r in results_list)
    warnings = _merge_warnings(results_list, shard_count, indices, kernel_paths)
    drafters = {name: _merge_drafter(name, results_list, samples) for name in names}
    seed = (first.get("settings") or {}).get("seed") or 0
    sampling = (first.get("settings") or {}).get("sampling")
    for name, d in drafters.items():
        by_dataset = dataset_breakdown(samples, name, seed=seed if isinstance(seed, int) else 0)
        if by_dataset is not None:
            d["metrics"]["by_dataset"] = by_dataset
        by_thinking = thinking_breakdown(samples, name, seed=seed if isinstance(seed, int) else 0)
        if by_thinking is not None:
            d["metrics"]["by_thinking"] = by_thinking
        if "by_context_depth" in ((first.get("drafters") or {}).get(name, {}).get("metrics") or {}):
            d["metrics"]["by_context_depth"] = by_context_depth(
                samples, name, seed=seed if isinstance(seed, int) else 0,
                rule=str((sampling or {}).get("draft_rule") or "greedy") if isinstance(sampling, dict) else "greedy")
        if isinstance(sampling, dict):  # T > 0: the expectations over every part's draws, CIs over all prompts
            d["metrics"]["sampled"] = sampled_figures(samples, name, d["metrics"]["block_size"], sampling=sampling,
                                                      seed=seed if isinstance(seed, int) else 0)
    shards = [_shard_record(r, s) for r, s in parts]
    merged = _other_keys(results_list, shards)

    settings = dict(first.get("settings") or {})
    settings.update(samples=len(samples), sample_ids=[s.get("id") for s in samples],
                    shard={"count": shard_count, "merged": indices})
    merged.update({
        "schema": first.get("schema"),
        "status": "ok",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": settings,
        "target": first.get("target"),
        "versions": first.get("versions"),
        "reference": _merge_reference(results_list),
        "extraction": _merge_extraction(results_list, kernel_paths),
        "drafters": drafters,
        "timings": _max_timings(results_list),
        "samples": {**(first.get("samples") or {}), "count": len(samples)},
        "shards": shards,
        "merge": {"parts": len(parts), "rule": (
            "samples concatenated in prompt order; every metric recomputed from the per-sample records; "
            "timings = maximum over the parts (they ran in parallel), each part's own under 'shards'; "
            "reference/extraction token counts summed, rates = total tokens / total seconds")},
    })
    if len(names) > 1:
        merged["comparison"] = _compare(first, samples, names, drafters)
    diagnostics = _merge_diagnostics(results_list)
    if diagnostics is not None:
        merged["diagnostics"] = diagnostics
    if warnings:
        merged["warnings"] = warnings
    return merged, samples


# ------------------------------------------------------------------------------------------- checks



def _merge_warnings(results_list: list[dict], shard_count, indices: list, kernel_paths: list) -> list[str]:
    """Every part's warnings (once each), then what merging itself finds: missing shards, mixed kernels/versions."""
    first = results_list[0]
    warnings: list[str] = []
    for r in results_list:
        warnings += [w for w in (r.get("warnings") or []) if w not in warnings]
    if shard_count is not None and indices != list(range(shard_count)):
        warnings.append(f"merged shards {indices} of {shard_count}: the results cover only part of the prompts")
    if len(kernel_paths) > 1:
        warnings.append(f"the parts extracted features with different linear-attention kernel paths "
                        f"({', '.join(map(str, kernel_paths))}): their hidden states differ numerically, so the "
                        "merged figures mix the two; compare the per-host τ before trusting them")
    version_diffs = sorted({k for r in results_list for k, v in (r.get("versions") or {}).items()
                            if v != (first.get("versions") or {}).get(k)})
    if version_diffs:
        warnings.append(f"the parts ran with different package versions ({', '.join(version_diffs)}); "
                        "see results['shards'] for each part's versions")
    return warnings


def _other_keys(results_list: list[dict], shards: list[dict]) -> dict:
    """Top-level keys not merged field by field: kept when equal in all parts, else moved to each shard record."""
    first = results_list[0]
    merged = {k: v for k, v in first.items() if k not in _MERGED_KEYS}
    for key in sorted({k for r in results_list for k in r} - _MERGED_KEYS):
        values = [r.get(key) for r in results_list]
        if any(v != values[0] for v in values):
            merged.pop(key, None)
            for rec, v in zip(shards, values, strict=True):
                rec[key] = v
    return merged

def _part(i: int, r: dict) -> str:
    shard = (r.get("settings") or {}).get("shard") or {}
    return f"part {i + 1} (shard {shard.get('index')}/{shard.get('count')})"


def _distinct(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _comparable_settings(r: dict) -> dict:
    s = {k: v for k, v in (r.get("settings") or {}).items() if k not in SHARD_KEYS}
    prompts = s.get("prompts")
    if isinstance(prompts, dict):  # the prompt file's path is host-local; its content is what must match
        s["prompts"] = {k: v for k, v in prompts.items() if k not in ("path", "source")}
    if isinstance(s.get("datasets"), list):  # likewise a dataset's files; its digest and selection must match
        s["datasets"] = [{k: v for k, v in d.items() if k != "source"} | {"sha256": (d.get("source") or {})
                          .get("sha256")} if isinstance(d, dict) else d for d in s["datasets"]]
    return s


def _check_compatible(results_list: Sequence[dict]) -> None:
    first = results_list[0]
    for i, r in enumerate(results_list):
        if r.get("status") != "ok":
            raise PayloadError(f"merge: {_part(i, r)} has status {r.get('status')!r}, not 'ok'; "
                               "rerun or drop that part")
        if r.get("schema") != first.get("schema"):
            raise PayloadError(f"merge: {_part(i, r)} has results schema {r.get('schema')!r}, "
                               f"{_part(0, first)} {first.get('schema')!r}; merge results of one payload version")
    digest0 = (first.get("target") or {}).get("weights_digest")
    if not digest0:
        raise PayloadError(f"merge: {_part(0, first)} records no target weights digest (target.weights_digest); "
                           "cannot tell whether the parts evaluated the same target")
    s0 = _comparable_settings(first)
    names0 = list(first.get("drafters") or {})
    seen_shards: dict = {}
    for i, r in enumerate(results_list):
        where = _part(i, r)
        digest = (r.get("target") or {}).get("weights_digest")
        if digest != digest0:
            raise PayloadError(f"merge: {where} evaluated target weights {str(digest)[:16]}…, "
                               f"{_part(0, first)} {digest0[:16]}…: the parts evaluated different targets")
        s = _comparable_settings(r)
        diff = sorted(k for k in set(s) | set(s0) if s.get(k) != s0.get(k))
        if diff:
            raise PayloadError(f"merge: {where} ran with other settings than {_part(0, first)}: "
                               + "; ".join(f"{k} = {s.get(k)!r} vs {s0.get(k)!r}" for k in diff))
        names = list(r.get("drafters") or {})
        if names != names0:
            raise PayloadError(f"merge: {where} evaluated drafters {names}, {_part(0, first)} {names0}")
        for name in names:
            d, d0 = r["drafters"][name], first["drafters"][name]
            spec, spec0 = _comparable_spec(d), _comparable_spec(d0)
            if spec != spec0:
                keys = sorted(k for k in set(spec) | set(spec0) if spec.get(k) != spec0.get(k))
                raise PayloadError(f"merge: drafter '{name}' has another spec in {where} than in "
                                   f"{_part(0, first)} (fields {', '.join(keys)})")
            dg, dg0 = (d.get("source") or {}).get("digest"), (d0.get("source") or {}).get("digest")
            if dg != dg0:
                raise PayloadError(f"merge: drafter '{name}' has checkpoint digest {str(dg)[:16]} in {where}, "
                                   f"{str(dg0)[:16]} in {_part(0, first)}: different weights")
            t, t0 = _tree_params(d), _tree_params(d0)
            if t != t0:
                raise PayloadError(f"merge: drafter '{name}' tree metrics used {t} in {where}, {t0} in "
                                   f"{_part(0, first)}")
        idx = (r.get("settings") or {}).get("shard", {}).get("index")
        if idx in seen_shards:
            raise PayloadError(f"merge: {where} and part {seen_shards[idx] + 1} are the same shard")
        seen_shards[idx] = i


def _comparable_spec(d: dict) -> dict:
    # notes are informational and may name host-local files (e.g. the sidecar spec's path)
    return {k: v for k, v in (d.get("spec") or {}).items() if k != "notes"}


def _tree_params(d: dict) -> dict | None:
    tree = (d.get("metrics") or {}).get("tree")
    if not tree or "not_defined" in tree:
        return None
    return {"k": (tree.get("topk") or {}).get("k"), "budget": (tree.get("budgeted") or {}).get("budget"),
            "K": (tree.get("budgeted") or {}).get("K")}


def _merge_samples(parts) -> list[dict]:
    samples: list[dict] = []
    where: dict[int, int] = {}  # prompt index -> the part holding it
    for i, (r, lines) in enumerate(parts):
        for line in lines:
            idx = line.get("index")
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise PayloadError(f"merge: a sample line of {_part(i, r)} has no integer 'index' "
                                   f"(id {line.get('id')!r})")
            if idx in where:
                raise PayloadError(f"merge: prompt index {idx} (id {line.get('id')!r}) is in {_part(i, r)} and "
                                   f"{_part(where[idx], parts[where[idx]][0])}")
            where[idx] = i
            samples.append(line)
        count = (r.get("samples") or {}).get("count")
        if count is not None and count != len(lines):
            raise PayloadError(f"merge: {_part(i, r)} announces {count} samples but its samples.jsonl holds "
                               f"{len(lines)}: incomplete pull?")
    return sorted(samples, key=lambda line: line["index"])


# ------------------------------------------------------------------------------------------- recompute


def _merge_drafter(name: str, results_list: Sequence[dict], samples: list[dict]) -> dict:
    d0 = results_list[0]["drafters"][name]
    metrics0 = d0.get("metrics") or {}
    B = metrics0.get("block_size") or (d0.get("spec") or {}).get("block_size")
    if not isinstance(B, int):
        raise PayloadError(f"merge: drafter '{name}' records no block size (metrics.block_size / spec.block_size)")
    chain, topk, budgeted = [], [], []
    tree = _tree_params(d0)
    online = []
    for line in samples:
        sid = line.get("id", line.get("index"))
        entry = (line.get("drafters") or {}).get(name)
        if entry is None:
            raise PayloadError(f"merge: sample {sid} has no results for drafter '{name}'")
        pt, ct = line.get("prompt_tokens"), line.get("continuation_tokens")
        if not isinstance(pt, int) or not isinstance(ct, int):
            raise PayloadError(f"merge: sample {sid} lacks integer 'prompt_tokens'/'continuation_tokens'")
        where = f"merge: sample {sid}, drafter '{name}'"
        chain.append(rounds_from_entry(entry, pt, ct, where))
        if tree:
            t = entry.get("tree") or {}
            if "topk" not in t or "budgeted" not in t:
                raise PayloadError(f"{where}: the results hold tree metrics but this sample has no 'tree' record")
            topk.append(rounds_from_entry(t["topk"], pt, ct, where + ", tree.topk"))
            budgeted.append(rounds_from_entry(t["budgeted"], pt, ct, where + ", tree.budgeted"))
        online.append((sid, entry.get("online")))
    metrics = summarize(chain, B)
    rule_entries = [((line.get("drafters") or {}).get(name) or {}).get("sampled_rule") for line in samples]
    if "draft_rule" in metrics0:
        metrics["draft_rule"] = metrics0["draft_rule"]
    if metrics0.get("draft_rule") == "sampled":  # the headline follows the sampled rule's expectations
        if not all(isinstance(e, dict) for e in rule_entries):
            raise PayloadError(f"merge: drafter '{name}' follows the sampled rule but a sample has no "
                               "'sampled_rule' entry")
        greedy = {k: metrics[k] for k in ("tau_macro", "tau_micro", "mean_accepted", "per_position", "tau_histogram")}
        metrics.update(rule_summary([e for e in rule_entries if isinstance(e, dict)], B), greedy_rule=greedy)
    if tree:
        metrics["tree"] = tree_summary(topk, budgeted, block_size=B, **tree)
    elif "not_defined" in (metrics0.get("tree") or {}):  # DFlash2: the statement travels with the merge
        metrics["tree"] = metrics0["tree"]
    if "accept_length_by_k" in metrics0:  # every sample line carries its per-K record (metrics.by_k)
        records = [((line.get("drafters") or {}).get(name) or {}).get("by_k") for line in samples]
        exact = all(((r["drafters"][name].get("metrics") or {}).get("accept_length_by_k") or {}).get("exact") is True
                    for r in results_list)
        metrics["accept_length_by_k"] = summarize_by_k(records, B, exact=exact)
    if "conventions" in metrics0:
        metrics["conventions"] = _merge_conventions(name, results_list, samples, chain, B)
    out = {k: v for k, v in d0.items() if k not in ("metrics", "online_check", "timings", "source")}
    sampled_online = any(isinstance((r["drafters"][name].get("online_check") or {}), dict)
                         and (r["drafters"][name].get("online_check") or {}).get("sampled") for r in results_list)
    merged_online = (_merge_sampled_online(samples, name, chain, metrics.get("conventions")) if sampled_online
                     else _merge_online(online)) if any(o is not None for _, o in online) else None
    out.update(spec=d0.get("spec"), source=d0.get("source"), metrics=metrics, online_check=merged_online,
               timings=_sum_numbers([r["drafters"][name].get("timings") or {} for r in results_list]))
    return out


def _merge_conventions(name: str, results_list: Sequence[dict], samples: list[dict], chain: list, B: int) -> dict:
    """The conventions block over all samples; zlab-2604/vllm unavailable if they were in any part (its reason)."""
    for i, r in enumerate(results_list):
        block = (r["drafters"][name].get("metrics") or {}).get("conventions")
        if not isinstance(block, dict):
            return conv.summaries(chain, None, None, B, unavailable=f"{_part(i, r)} has no τ conventions (an "
                                                                     "older payload)")
        april = block.get("zlab-2604") or {}
        if april.get("available") is False:
            return conv.summaries(chain, None, None, B, unavailable=f"{_part(i, r)}: {april.get('reason')}")
    zlab_2604, vllm, exact = [], [], True
    for line, committed in zip(samples, chain, strict=True):
        where = f"merge: sample {line.get('id', line.get('index'))}, drafter '{name}'"
        records = (line.get("drafters") or {}).get(name, {}).get("conventions")
        tail = line.get("tail_tokens")
        if not isinstance(records, dict) or not isinstance(tail, int) or isinstance(tail, bool):
            raise PayloadError(f"{where}: the results hold zlab-2604/vllm τ but this sample has no 'conventions' "
                               "record or no integer 'tail_tokens'")
        zlab_2604.append(conv.rounds_from_record(records.get("zlab-2604"), B, where + ", conventions.zlab-2604"))
        vllm.append(conv.rounds_from_record(records.get("vllm"), B, where + ", conventions.vllm"))
        if len(vllm[-1]) != len(committed):
            raise PayloadError(f"{where}: conventions.vllm has {len(vllm[-1])} rounds, the committed record "
                               f"{len(committed)} (vllm counts the committed rounds in full)")
        exact = exact and tail >= B - 1
    return conv.summaries(chain, zlab_2604, vllm, B, exact=exact)


def _merge_online(per_sample: list) -> dict:
    done = [(sid, o) for sid, o in per_sample if o is not None]
    taus = [o.get("tau") for _, o in done if o.get("tau") is not None]
    return {"samples": len(done),
            "all_outputs_equal_reference": all(o.get("output_equals_reference") for _, o in done),
            "all_rounds_identical": all(o.get("rounds_identical") for _, o in done),
            "mismatched_samples": [sid for sid, o in done
                                   if not (o.get("output_equals_reference") and o.get("rounds_identical"))],
            "tau_macro_online": sum(taus) / len(taus) if taus else None,
            "seconds": round(sum(o.get("seconds") or 0.0 for _, o in done), 3),
            "not_checked": len(per_sample) - len(done)}


def _merge_sampled_online(samples: list[dict], name: str, chain: list, conventions: dict | None) -> dict:
    """The T > 0 online check over all parts' draws, recomputed from each line's offline and online τ."""
    entries = [(line.get("drafters") or {}).get(name) or {} for line in samples]
    online = [o if isinstance(o, dict) else {} for o in (e.get("online") for e in entries)]
    zlab_2604 = [_mean_produced(((e.get("conventions") or {}).get("zlab-2604") or {}).get("produced"))
                 for e in entries]
    seconds = sum(o.get("seconds") or 0.0 for o in online if _real(o.get("seconds")))
    if all(isinstance(e.get("sampled_rule"), dict) for e in entries):  # the sampled rule's loop and estimate
        offline = [e["sampled_rule"].get("tau") for e in entries]
        return online_summary(offline, [None] * len(entries), online, clusters_of(samples), seconds, rule="sampled",
                              offline_var=[e["sampled_rule"].get("tau_var") for e in entries])
    offline = [sum(r.produced for r in rs) / len(rs) if rs else None for rs in chain]
    return online_summary(offline, zlab_2604, online, clusters_of(samples), seconds)


def _compare(first: dict, samples: list[dict], names: list[str], drafters: dict) -> dict:
    prev = first.get("comparison") or {}
    return compare_drafters(samples, names,
                            block_sizes={n: drafters[n]["metrics"]["block_size"] for n in names},
                            resamples=prev.get("resamples", DEFAULT_RESAMPLES),
                            confidence=prev.get("confidence", DEFAULT_CONFIDENCE), seed=prev.get("seed", 0),
                            tree_not_defined=[n for n in names
                                              if "not_defined" in (drafters[n]["metrics"].get("tree") or {})])


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _sum_numbers(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            if _is_number(v):
                out[k] = round(out.get(k, 0) + v, 3)
    return out


def _max_timings(results_list) -> dict:
    out: dict = {}
    for r in results_list:
        for k, v in (r.get("timings") or {}).items():
            if _is_number(v):
                out[k] = max(out.get(k, v), v)
    return out


def _rate_total(parts: list[dict], tokens_key: str) -> float | None:
    """Σ tokens / Σ seconds, the seconds of each part recovered as tokens / rate."""
    tokens = seconds = 0.0
    for p in parts:
        n, rate = p.get(tokens_key) or 0, p.get("tokens_per_s")
        if n:
            if not rate:
                return None
            tokens, seconds = tokens + n, seconds + n / rate
    return round(tokens / seconds, 2) if seconds else None


def _merge_reference(results_list) -> dict:
    parts = [r.get("reference") or {} for r in results_list]
    stops: dict = {}
    for p in parts:
        for k, v in (p.get("stop_reasons") or {}).items():
            stops[k] = stops.get(k, 0) + v
    out = {"tokens_generated": sum(p.get("tokens_generated") or 0 for p in parts),
           "tokens_per_s": _rate_total(parts, "tokens_generated"),
           "cache_hits": sum(p.get("cache_hits") or 0 for p in parts), "stop_reasons": stops}
    sources = _distinct(p.get("source") for p in parts if p.get("source"))
    if sources:
        out = {"source": sources[0] if len(sources) == 1 else "mixed: " + ", ".join(sources), **out}
    servers = [p["server"] for p in parts if isinstance(p.get("server"), dict)]
    if servers:
        out["server"] = _merge_servers(servers)
    in_order = sorted(results_list, key=lambda r: ((r.get("settings") or {}).get("shard") or {}).get("index") or 0)
    decodes = [p["decode"] for p in (r.get("reference") or {} for r in in_order) if isinstance(p.get("decode"), dict)]
    if decodes:  # each host decoded its own shard, at its own batch: one block per shard, in shard order
        out["decode"] = decodes
    return out


def _merge_servers(servers: list[dict]) -> dict:
    """Each host asked its own endpoint: URLs and models listed, counts summed, mismatching samples joined."""
    ids_source: dict = {}
    for srv in servers:
        for k, v in (srv.get("ids_source") or {}).items():
            ids_source[k] = ids_source.get(k, 0) + v
    return {"source": "server", "urls": _distinct(srv.get("url") for srv in servers),
            "models": _distinct(srv.get("model") for srv in servers),
            "prompt_format": servers[0].get("prompt_format"), "settings": servers[0].get("settings"),
            **{k: sum(srv.get(k) or 0 for srv in servers) for k in ("samples", "requested", "cache_hits",
                                                                       "tokens_generated", "roundtrip_unchecked")},
            "roundtrip_mismatches": [sid for srv in servers for sid in srv.get("roundtrip_mismatches") or []],
            "ids_source": ids_source}


def _merge_diagnostics(results_list) -> dict | None:
    """Diagnostics describe each part's own samples: kept per part, findings tagged with the part, texts joined."""
    parts = [(_part(i, r), r["diagnostics"]) for i, r in enumerate(results_list) if r.get("diagnostics")]
    if not parts:
        return None
    findings = [{**f, "part": where} for where, d in parts for f in d.get("findings") or []]
    text = "\n\n".join(f"=== {where} ===\n{d.get('text') or ''}" for where, d in parts)
    return {"parts": [{"part": where, **{k: v for k, v in d.items() if k != "text"}} for where, d in parts],
            "findings": findings, "text": text}


def _merge_extraction(results_list, kernel_paths) -> dict:
    parts = [r.get("extraction") or {} for r in results_list]
    layers = _distinct(p.get("layers") for p in parts)
    if len(layers) > 1:
        raise PayloadError(f"merge: the parts extracted different target layers {layers}")
    return {**parts[0], "layers": layers[0], "tokens": sum(p.get("tokens") or 0 for p in parts),
            "tokens_per_s": _rate_total(parts, "tokens"),
            "cache_hits": sum(p.get("cache_hits") or 0 for p in parts),
            "kernel_path": kernel_paths[0] if len(kernel_paths) == 1 else "mixed: " + ", ".join(map(str, kernel_paths)),
            "teacher_forced_mismatches": sum(p.get("teacher_forced_mismatches") or 0 for p in parts)}


def _shard_record(r: dict, lines: list[dict]) -> dict:
    s, t, e = r.get("settings") or {}, r.get("target") or {}, r.get("extraction") or {}
    return {"shard": s.get("shard"), "samples": len(lines), "sample_ids": [line.get("id") for line in lines],
            "hosts": _distinct(line["host"] for line in lines if "host" in line),
            "created_utc": r.get("created_utc"), "device": s.get("device"), "cache_dir": s.get("cache_dir"),
            "target_path": t.get("path"), "kernel_path": e.get("kernel_path"), "kernels": t.get("kernels"),
            "versions": r.get("versions"), "timings": r.get("timings"),
            "reference": r.get("reference"), "extraction": {k: v for k, v in e.items() if k != "layers"},
            "drafters": {n: {"source": d.get("source"), "timings": d.get("timings"),
                             "tau_macro": (d.get("metrics") or {}).get("tau_macro"),
                             "online_check": d.get("online_check")}
                         for n, d in (r.get("drafters") or {}).items()}}


# ------------------------------------------------------------------------------------------- per dataset

BY_DATASET_NOTE = ("per benchmark dataset (columns of z-lab's tables): τ macro = mean over the dataset's samples "
                   "(each turn of a multi-turn row one sample), committed (= zlab) and zlab-2604 conventions, 95% "
                   "percentile bootstrap CI over samples; by_category: the dataset's categories (mt-bench's eight, "
                   "MATH-500's subjects)")


def dataset_breakdown(lines: Sequence[dict], name: str, *, seed: int = 0) -> dict | None:
    """``metrics.by_dataset`` of drafter ``name`` from the sample lines (None when no line names a dataset):
    per dataset, and per category inside it, the committed and zlab-2604 τ macro with CIs, the committed τ micro
    and, with ``--engine``, the engine's τ (1 + accepted / rounds over the dataset's requests)."""
    groups: dict[str, list[dict]] = {}
    for line in lines:
        dataset = line.get("dataset")
        if isinstance(dataset, str):
            groups.setdefault(dataset, []).append(line)
    if not groups:
        return None
    out = {}
    for dataset, members in groups.items():
        block = _group_figures(members, name, seed)
        categories: dict[str, list[dict]] = {}
        for line in members:
            if isinstance(line.get("category"), str):
                categories.setdefault(line["category"], []).append(line)
        if categories:
            block["by_category"] = {c: _group_figures(m, name, seed) for c, m in sorted(categories.items())}
        out[dataset] = block
    return out


THINKING_NOTE = ("--enable-thinking both: every prompt evaluated under both chat-template modes; per mode the "
                 "figures of by_dataset over that mode's samples; paired = mean over prompts of τ(on) − τ(off) "
                 "(each prompt's τ macro under each mode, at T > 0 the mean over its draws), 95% percentile "
                 "bootstrap CI over prompts")


def thinking_breakdown(lines: Sequence[dict], name: str, *, seed: int = 0) -> dict | None:
    """``metrics.by_thinking`` of drafter ``name`` (None when no line names a thinking mode): each mode's figures
    (``_group_figures``) and the paired difference on − off over the prompts evaluated under both."""
    modes: dict[bool, list[dict]] = {False: [], True: []}
    per_pair: dict[object, dict[bool, list[float]]] = {}
    for line in lines:
        mode = line.get("thinking")
        if not isinstance(mode, bool):
            continue
        modes[mode].append(line)
        tau = ((line.get("drafters") or {}).get(name) or {}).get("tau")
        if tau is not None and _real(tau):
            per_pair.setdefault(line.get("thinking_pair"), {False: [], True: []})[mode].append(float(tau))
    if not modes[False] and not modes[True]:
        return None
    diffs = [sum(p[True]) / len(p[True]) - sum(p[False]) / len(p[False]) for p in per_pair.values()
             if p[True] and p[False]]
    ci = bootstrap_mean_ci(diffs, seed=seed)
    return {"off": _group_figures(modes[False], name, seed), "on": _group_figures(modes[True], name, seed),
            "paired": {"difference": sum(diffs) / len(diffs) if diffs else None, "ci": list(ci) if ci else None,
                       "prompts": len(diffs), "verdict": verdict(
                           ci, higher="τ is higher with thinking on", lower="τ is lower with thinking on",
                           same="no clear difference between the modes", unit="prompts")},
            "definition": THINKING_NOTE}


def _group_figures(lines: Sequence[dict], name: str, seed: int) -> dict:
    with_entry = [(line, e) for line in lines if isinstance(e := (line.get("drafters") or {}).get(name), dict)]
    entries = [e for _, e in with_entry]
    clusters = clusters_of([line for line, _ in with_entry])  # at T > 0 a prompt's draws, else each line alone
    committed = [t for e in entries if _real(t := e.get("tau"))]
    committed_clusters = [c for e, c in zip(entries, clusters, strict=True) if _real(e.get("tau"))]
    produced = [p for e in entries for p in (e.get("produced") or []) if _real(p)]
    april = [_mean_produced(((e.get("conventions") or {}).get("zlab-2604") or {}).get("produced")) for e in entries]
    engine = [e["engine"] for e in entries if isinstance(e.get("engine"), dict)]
    rounds = sum(x.get("rounds") or 0 for x in engine if _real(x.get("rounds")))
    accepted = sum(x.get("drafts_accepted") or 0 for x in engine if _real(x.get("drafts_accepted")))
    out = {"samples": len(lines),
           "tau_macro": _macro(committed, seed, committed_clusters),
           "tau_micro": sum(produced) / len(produced) if produced else None,
           "zlab_2604_tau_macro": _macro([z for z in april if z is not None], seed, clusters)
           if april and None not in april else None}
    if engine:
        out["engine_tau"] = 1 + accepted / rounds if rounds else None
        out["engine_samples"] = len(engine)
    return out


def _macro(values: list, seed: int, clusters: list[int] | None = None) -> dict | None:
    """Mean with its bootstrap CI; with ``clusters`` that group values (T > 0: a prompt's draws) the resample
    draws clusters."""
    if not values:
        return None
    if clusters is not None and len(set(clusters)) < len(clusters):
        renumber = {c: j for j, c in enumerate(dict.fromkeys(clusters))}
        sums = cluster_sums([[v, 1.0] for v in values], [renumber[c] for c in clusters])
        cis = bootstrap_cis(len(sums), lambda idx: {"m": sum(sums[i][0] for i in idx) / sum(sums[i][1] for i in idx)},
                            seed=seed)
        ci = cis.get("m")
    else:
        ci = bootstrap_mean_ci(values, seed=seed)
    return {"value": sum(values) / len(values), "ci": [ci[0], ci[1]] if ci else None, "samples": len(values)}


def _mean_produced(produced) -> float | None:
    if not isinstance(produced, list) or not produced or not all(_real(p) for p in produced):
        return None
    return sum(produced) / len(produced)


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
