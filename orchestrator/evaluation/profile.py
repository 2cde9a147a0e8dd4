"""speculation_profile.json: the portable acceptance card of one drafter (schema "1.0"), built from a run.

The card is read by other tools (simulators, an engine's synthetic acceptance sampler), so its field names
and units follow the schema exactly. Position i of the rate lists is the (i+1)-th draft: its acceptance
makes an accept length of i + 2 (the bonus token counts one). The accept length per step is 1 + accepted
drafts, so ``mean_accept_length`` = 1 + Σ ``marginal_accept_rates`` exactly; ``validation`` records that
check and the monotonicity of the marginals. Steps are counted as the engines' counters count them: 1 +
accepted drafts, drafts accepted past the stop token included (the payload's ``vllm`` convention, from the
target's tokens past the stop; the committed rounds where a run has none). ``accept_length_by_k`` is measured
per K with the drafter run at a block of K + 1 rows, as vLLM's and SGLang's DFlash proposers plan it
(``remote_payload/metrics/by_k.py``, method ``replanned``); dfo's profiles before it truncated the full block's
drafts (method ``truncated``, recognised by ``by_k_method``). dfo-specific figures (CIs, the committed τ and
the committed per-K figures) live under ``x_dfo``, which readers of the schema ignore.
Pure: dicts in, dicts out; ``write_profiles`` is the only function that touches files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from orchestrator.core.atomic_file import write_text_atomic
from orchestrator.core.errors import InputError
from remote_payload.models.spec import MAX_BLOCK_SIZE  # the largest block a drafter may declare

SCHEMA_VERSION = "1.0"
TOLERANCE = 0.02
PROFILE_SUFFIX = ".speculation_profile.json"
REQUIRED = ("schema_version", "marginal_accept_rates", "mean_accept_length")
BY_K_METHOD = "replanned"  # METHOD in remote_payload/metrics/by_k.py (the controller never imports the payload)
OLD_BY_K_METHOD = "truncated"  # dfo's profiles before BY_K_METHOD: no measurement_conditions.accept_length_by_k
ENGINE_COUNT = "vllm"  # the payload's convention counting as the engines' counters do


def _obj(x) -> dict:
    return x if isinstance(x, dict) else {}


def _ints(x) -> list[int]:
    return [v for v in x if isinstance(v, int) and not isinstance(v, bool)] if isinstance(x, list) else []


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def rates_from_rounds(accepted: list[int], drafts: int) -> dict:
    """Marginal and conditional rates, mean accept length and histogram from per-round accepted counts."""
    n = len(accepted)
    marginal = [sum(1 for a in accepted if a >= i) / n if n else 0.0 for i in range(1, drafts + 1)]
    conditional, prev = [], 1.0
    for m in marginal:
        conditional.append(m / prev if prev > 0 else 0.0)
        prev = m
    hist = {str(length): 0 for length in range(1, drafts + 2)}
    for a in accepted:
        hist[str(min(a, drafts) + 1)] += 1
    return {"marginal": [round(m, 6) for m in marginal], "conditional": [round(c, 6) for c in conditional],
            "mean": round(1 + sum(accepted) / n, 6) if n else None, "histogram": hist, "rounds": n}


def validation(marginals: list[float], mean: float | None) -> dict:
    """The schema's own checks: mean = 1 + Σ marginals (within 0.02) and marginals non-increasing."""
    total = 1 + sum(marginals)
    diff = abs(total - mean) if mean is not None else None
    non_increasing = all(b <= a + 1e-9 for a, b in zip(marginals, marginals[1:], strict=False))
    ok_mean = diff is not None and diff <= TOLERANCE
    return {"mean_matches_marginals": ok_mean, "mean_minus_one_plus_sum": round(total - mean, 6) if mean else None,
            "tolerance": TOLERANCE, "marginals_non_increasing": non_increasing, "passed": ok_mean and non_increasing}


def _sample_accepted(samples: list[dict], name: str) -> tuple[list[tuple[dict, list[int]]], str]:
    """Per sample the accepted drafts per step, engine-counted (the ``vllm`` convention's records) when every
    sample has them, else the committed rounds'; and which."""
    entries = [_obj(_obj(s.get("drafters")).get(name)) for s in samples]
    engine = [_obj(_obj(e.get("conventions")).get(ENGINE_COUNT)) for e in entries]
    if entries and all(isinstance(e.get("accepted"), list) for e in engine):
        return [(s, _ints(e.get("accepted"))) for s, e in zip(samples, engine, strict=True)], ENGINE_COUNT
    return [(s, _ints(e.get("accepted"))) for s, e in zip(samples, entries, strict=True)], "committed"


COUNTING = {ENGINE_COUNT: "accept length per step = 1 + accepted drafts, drafts accepted past the stop token "
                          "included (the engines' counters; dfo's vllm convention)",
            "committed": "accept length per step = 1 + accepted drafts, the last step capped at the tokens kept "
                         "(the run has no target tokens past the stop, so this is a lower bound of the engines' "
                         "count there)"}


def _conditions(results: dict, name: str, drafter: dict, counted: str) -> dict:
    settings, target = _obj(results.get("settings")), _obj(results.get("target"))
    versions = _obj(results.get("versions"))
    sampling = settings.get("sampling")
    engine = _obj(results.get("engine"))
    datasets = [{k: d.get(k) for k in ("name", "split", "selection", "rows", "turns") if k in d} | (
        {"sha256": _obj(d.get("source")).get("sha256")} if _obj(d.get("source")).get("sha256") else {})
        for d in (settings.get("datasets") or []) if isinstance(d, dict)]
    prompts = _obj(settings.get("prompts"))
    return {
        "datasets": datasets or None,
        "prompts": {k: prompts.get(k) for k in ("name", "sha256", "count") if k in prompts} or None,
        "selection": settings.get("selection"),
        "samples": settings.get("samples"),
        "temperature": _obj(sampling).get("temperature", 0.0) if sampling else 0.0,
        "top_p": _obj(sampling).get("top_p", 1.0) if sampling else 1.0,
        "top_k": _obj(sampling).get("top_k", 0) if sampling else 0,
        "draft_rule": settings.get("draft_rule") or "greedy top-1 drafts, longest accepted prefix",
        "max_new_tokens": settings.get("max_new_tokens"),
        "enable_thinking": settings.get("enable_thinking"),
        "chat_template_sha256": settings.get("chat_template_sha256"),
        "dtype": settings.get("dtype"),
        "convention": COUNTING[counted] + "; rounds replayed offline over the target's own continuation "
                                           "(teacher forcing)",
        "accept_length_by_k": _by_k_conditions(_obj(_obj(drafter.get("metrics")).get("accept_length_by_k"))),
        "dfo_version": versions.get("payload"),
        "target_weights_digest": target.get("weights_digest"),
        "drafter_digest": _obj(drafter.get("source")).get("digest"),
        "engine": ({"name": engine.get("name"), "version": engine.get("version"),
                    "num_speculative_tokens": _obj(drafter.get("engine")).get("num_speculative_tokens"),
                    "model_runner": engine.get("model_runner")} if engine else None),
    }


def _by_k_conditions(block: dict) -> dict | None:
    """How this card's accept_length_by_k was measured and counted (None without per-K figures)."""
    if not block:
        return None
    return {"method": block.get("method") or OLD_BY_K_METHOD, "definition": block.get("definition"),
            "committed_definition": block.get("committed_definition"), "exact": block.get("exact")}


def by_k_method(profile: dict) -> str | None:
    """How a card's ``accept_length_by_k`` was measured: ``measurement_conditions.accept_length_by_k.method``;
    ``truncated`` for a dfo card written before it (it has ``x_dfo`` and per-K figures but no method); None for
    another tool's card that does not say, or a card without per-K figures."""
    if not profile.get("accept_length_by_k"):
        return None
    method = _obj(_obj(profile.get("measurement_conditions")).get("accept_length_by_k")).get("method")
    if isinstance(method, str):
        return method
    return OLD_BY_K_METHOD if isinstance(profile.get("x_dfo"), dict) else None


def build_profile(results: dict, samples: list[dict], name: str) -> dict:
    """The schema-1.0 card of drafter NAME of a run (results.json and samples.jsonl)."""
    drafter = _obj(_obj(results.get("drafters")).get(name))
    metrics = _obj(drafter.get("metrics"))
    B = metrics.get("block_size") or _obj(drafter.get("spec")).get("block_size")
    if not isinstance(B, int) or isinstance(B, bool) or B < 2:
        raise InputError(f"drafter '{name}': results.json records no block size (metrics.block_size)")
    if B > MAX_BLOCK_SIZE:  # the payload evaluates no larger block: a host's results are data until bounded
        raise InputError(f"drafter '{name}': results.json records block size {B}, more than {MAX_BLOCK_SIZE} "
                         "(the largest the eval accepts): not a run dfo made")
    per_sample, counted = _sample_accepted(samples, name)
    bad = next((a for _, acc in per_sample for a in acc if not 0 <= a < B), None)
    if bad is not None:
        raise InputError(f"drafter '{name}': samples.jsonl records a round with {bad} accepted drafts; a block of "
                         f"{B} holds 0-{B - 1}")
    all_accepted = [a for _, acc in per_sample for a in acc]
    rates = rates_from_rounds(all_accepted, B - 1)
    per_request = [1 + sum(acc) / len(acc) for _, acc in per_sample if acc]
    by_k_block = _obj(_obj(metrics.get("accept_length_by_k")).get("by_k"))
    by_k = {k: _obj(v).get("mean_accept_length") for k, v in by_k_block.items()}
    by_k_ci = {k: _obj(v).get("ci95") for k, v in by_k_block.items() if _obj(v).get("ci95")}
    by_k_committed = {k: _obj(_obj(v).get("committed")).get("mean_accept_length") for k, v in by_k_block.items()
                      if _obj(_obj(v).get("committed")).get("mean_accept_length") is not None}
    categories: dict[str, list[int]] = {}
    for s, acc in per_sample:
        key = str(s.get("dataset") or s.get("category") or "all")
        if isinstance(s.get("thinking"), bool):  # --enable-thinking both: each mode its own category
            key += f" (thinking {'on' if s['thinking'] else 'off'})"
        categories.setdefault(key, []).extend(acc)
    per_category = {}
    for cat, acc in categories.items():
        r = rates_from_rounds(acc, B - 1)
        per_category[cat] = {"marginal_accept_rates": r["marginal"], "conditional_accept_rates": r["conditional"],
                             "mean_accept_length": r["mean"], "num_steps": r["rounds"]}
    profile = {
        "schema_version": SCHEMA_VERSION,
        "measured": results.get("created_utc"),
        "method": "dflash",
        "draft_checkpoint": _obj(drafter.get("source")).get("path") or name,
        "target_model": _obj(results.get("target")).get("name") or _obj(results.get("target")).get("path"),
        "num_speculative_tokens": B - 1,
        "block_size": B,
        "max_supported_k": B - 1,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": rates["conditional"],
        "marginal_accept_rates": rates["marginal"],
        "mean_accept_length": rates["mean"],
        "mean_accept_length_per_request": round(sum(per_request) / len(per_request), 6) if per_request else None,
        "accept_length_model": "measured_per_k",
        "accept_length_by_k": by_k or None,
        "acceptance_length_histogram": rates["histogram"],
        "per_category": per_category,
        "measurement_conditions": _conditions(results, name, drafter, counted),
        "validation": validation(rates["marginal"], rates["mean"]),
        "x_dfo": {"drafter": name, "num_steps": rates["rounds"], "tau_macro_committed": metrics.get("tau_macro"),
                  "tau_micro_committed": metrics.get("tau_micro"),
                  "position_offset": "rate position i <-> accept length i + 2"},
    }
    if by_k_ci:
        profile["x_dfo"]["accept_length_by_k_ci95"] = by_k_ci
    if by_k_committed:
        profile["x_dfo"]["accept_length_by_k_committed"] = by_k_committed
    synthetic = _obj(_obj(drafter.get("engine")).get("synthetic_check"))
    if synthetic:  # --engine-check synthetic: the engine replayed this card's marginals
        profile["x_dfo"]["engine_synthetic_check"] = {k: synthetic.get(k) for k in (
            "expected_mean", "measured_mean", "bound", "rounds", "within", "unsupported", "error") if k in synthetic}
    by_k_check = _obj(_obj(drafter.get("engine")).get("by_k_check"))
    if by_k_check:  # the engine's acceptance at each K it ran, beside this card's figure and CI there
        profile["x_dfo"]["engine_by_k_check"] = {str(k): {f: _obj(v).get(f) for f in (
            "engine_mean_accept_length", "profile_mean_accept_length", "profile_ci95", "within_ci")}
            for k, v in by_k_check.items()}
    depth = _obj(metrics.get("by_context_depth"))
    if depth:  # τ and p1 per context-depth bucket with their CIs (remote_payload/metrics/depth.py)
        profile["x_dfo"]["by_context_depth"] = {
            "layout": depth.get("layout"), "definition": depth.get("definition"),
            "buckets": [{k: b.get(k) for k in ("label", "lo", "hi", "samples", "rounds", "tau_macro", "p1")}
                        for b in depth.get("buckets") or [] if isinstance(b, dict)]}
    thinking = _obj(metrics.get("by_thinking"))
    if thinking:  # --enable-thinking both: τ per mode and the paired difference (per_category has each mode's rates)
        profile["x_dfo"]["by_thinking"] = {
            "off": _obj(thinking.get("off")).get("tau_macro"), "on": _obj(thinking.get("on")).get("tau_macro"),
            "paired": thinking.get("paired")}
    sampled = metrics.get("sampled")
    if isinstance(sampled, dict):  # T > 0: the rates are expectations over draws; their CIs for dfo's readers
        profile["x_dfo"]["sampled_ci"] = {
            "tau_micro": sampled.get("tau_micro"), "tau_macro": sampled.get("tau_macro"),
            "per_position": sampled.get("per_position"), "draws": sampled.get("draws")}
    return profile


def write_profiles(run_dir: Path, results: dict, samples: list[dict], skipped: list[str] | None = None) -> list[Path]:
    """runs/<run>/profiles/<drafter>.speculation_profile.json for every drafter (temp name, then renamed). With
    ``skipped``, a drafter whose results cannot make a profile is left out and its reason appended there (a pull
    keeps the run); without it, that is an error."""
    out_dir = run_dir / "profiles"
    paths = []
    for name in _obj(results.get("drafters")):
        if not _safe_name(name):
            continue  # a host-supplied name that is no plain file name is never made a path
        try:
            profile = build_profile(results, samples, name)
        except InputError as exc:
            if skipped is None:
                raise
            skipped.append(exc.message)
            continue
        out_dir.mkdir(exist_ok=True)
        path = out_dir / f"{name}{PROFILE_SUFFIX}"
        write_text_atomic(path, json.dumps(profile, indent=2) + "\n")
        paths.append(path)
    return paths


def _safe_name(name: object) -> bool:
    return (isinstance(name, str) and 0 < len(name) <= 100 and name not in (".", "..")
            and all(c.isalnum() or c in "-_.@+" for c in name))


def load_profile(path: Path) -> dict:
    """A profile from dfo or another tool; a clear error for an unknown schema or a missing field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the profile ({exc})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a speculation profile is a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(f"{path}: speculation profile schema_version {version!r} is not one dfo reads "
                         f"(it reads {SCHEMA_VERSION!r})", hint="export the profile with schema 1.0")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise InputError(f"{path}: speculation profile lacks {', '.join(missing)}")
    check_profile(data, str(path))
    return data


def check_profile(data: dict, where: str) -> None:
    """The rules dfo's export applies (``validation``), on a card read back: rates finite and in [0, 1], at most
    one per draft of the largest block, marginals non-increasing, mean accept length = 1 + Σ marginals within
    TOLERANCE, per-K accept lengths finite and at least 1. An InputError names WHERE and the field (pure)."""
    marg = data.get("marginal_accept_rates")
    if not isinstance(marg, list) or not 0 < len(marg) < MAX_BLOCK_SIZE:
        raise InputError(f"{where}: marginal_accept_rates must be a list of 1-{MAX_BLOCK_SIZE - 1} rates")
    for field in ("marginal_accept_rates", "conditional_accept_rates"):
        rates = data.get(field)
        if field not in data or rates is None and field != "marginal_accept_rates":
            continue
        if not isinstance(rates, list) or len(rates) >= MAX_BLOCK_SIZE:
            raise InputError(f"{where}: {field} must be a list of at most {MAX_BLOCK_SIZE - 1} rates")
        for i, rate in enumerate(rates):
            if not (_number(rate) and 0 <= rate <= 1):
                raise InputError(f"{where}: {field}[{i}] is {rate!r}: expected a rate in [0, 1]",
                                 hint="re-export the profile with `dfo runs profile RUN`")
    checked = validation([float(m) for m in marg], data.get("mean_accept_length") if _number(
        data.get("mean_accept_length")) else None)
    if not checked["marginals_non_increasing"]:
        i = next(i for i in range(1, len(marg)) if marg[i] > marg[i - 1] + 1e-9)
        raise InputError(f"{where}: marginal_accept_rates increase at position {i} ({marg[i - 1]} -> {marg[i]}): "
                         "the share of steps that accept i drafts never grows with i")
    if not checked["mean_matches_marginals"]:
        raise InputError(f"{where}: mean_accept_length is {data.get('mean_accept_length')!r}, expected 1 + the sum "
                         f"of marginal_accept_rates = {1 + sum(marg):.4f} (within {TOLERANCE})")
    by_k = data.get("accept_length_by_k")
    if by_k is not None:
        if not isinstance(by_k, dict) or len(by_k) >= MAX_BLOCK_SIZE:
            raise InputError(f"{where}: accept_length_by_k must be an object of K -> accept length")
        for k, value in by_k.items():
            if not (str(k).isdigit() and 0 < int(str(k)) < MAX_BLOCK_SIZE) or not (
                    value is None or _number(value) and 1 <= value <= MAX_BLOCK_SIZE):
                raise InputError(f"{where}: accept_length_by_k[{str(k)[:20]!r}] is {value!r}: expected K in "
                                 f"1-{MAX_BLOCK_SIZE - 1} and an accept length of at least 1")


def accept_length_at(profile: dict, k: int) -> float | None:
    """Mean accept length at K: measured (accept_length_by_k), else from the marginals' first K rates."""
    by_k = _obj(profile.get("accept_length_by_k"))
    v = by_k.get(str(k), by_k.get(k))
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    marg = profile.get("marginal_accept_rates") or []
    return 1 + sum(marg[:k]) if k <= len(marg) else None


def compare_profiles(a: dict, b: dict) -> dict:
    """Two cards side by side: accept length per K (measured, else from the marginals) and per position."""
    ks = range(1, max(len(a.get("marginal_accept_rates") or []), len(b.get("marginal_accept_rates") or [])) + 1)
    rows = []
    for k in ks:
        ta, tb = accept_length_at(a, k), accept_length_at(b, k)
        rows.append({"k": k, "accept_length_a": ta, "accept_length_b": tb,
                     "delta": round(tb - ta, 6) if ta is not None and tb is not None else None})
    ma, mb = a.get("mean_accept_length"), b.get("mean_accept_length")
    same = {key: (_obj(a.get("measurement_conditions")).get(key), _obj(b.get("measurement_conditions")).get(key))
            for key in ("datasets", "prompts", "temperature", "top_p", "top_k", "draft_rule", "target_weights_digest")}
    methods = {"a": by_k_method(a), "b": by_k_method(b)}
    out = {"mean_accept_length": {"a": ma, "b": mb}, "by_k": rows, "by_k_method": methods,
           "conditions_differ": sorted(k for k, (x, y) in same.items() if x is not None and y is not None
                                       and x != y)}
    if methods["a"] != methods["b"] and methods["a"] and methods["b"]:
        out["methods_differ"] = (f"accept_length_by_k was measured by different methods: A {methods['a']}, B "
                                 f"{methods['b']}; their figures are not comparable ({OLD_BY_K_METHOD}: the full "
                                 f"block's drafts cut to K, an accept length no engine reports; {BY_K_METHOD}: the "
                                 "block planned at K + 1 rows and counted as the engines count; evaluate the older "
                                 "card's drafter again with this dfo to compare them)")
    return out
