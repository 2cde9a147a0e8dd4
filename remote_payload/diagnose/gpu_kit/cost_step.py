"""Step ``cost``: the eval's cost at the real size, on random weights built from the published configurations.

Sections, each saved as soon as it is measured (``real_size.py`` builds the models):

- ``build``: the target on the device (parameters, bytes, the kernel path bound, seconds);
- ``extraction``: the payload's ``extract`` on 2,048-token samples at the drafter's fc layers: the first call
  (Triton compiles and autotunes there) apart from the timed ones, tokens/s and the CUDA peak over them;
- ``decode``: the payload's greedy decoding (the reference stage) after a prefill of ``decode_context`` tokens:
  seconds per new token, from two decodes that differ only in their length;
- ``batched_decode``: the reference stage's batched decoding at 1, 8, 32 and 128 rows (or the largest that fits):
  tokens/s and the CUDA peak per batch;
- ``drafter``: the eval's draft pass and replays over one extracted sample: the chain (top-1 pass, chain
  replay) and DDTree-8 (the eval's own pass, top-``draft_topk``, then the top-8 and budgeted tree replays);
  each timed pass after two untimed ones with its own top-k (a short sample, then the whole one);
- ``sampled_rule``: the sampled rule's exact estimator at T = 1 on the same sample (the target's law from one
  teacher-forced pass, the drafter's law at every anchor, the per-(anchor, slot) reductions, the
  forward/backward), beside the greedy rule's chain cost above;
- ``dflash2_drafter``: the same draft pass and chain replay for a DFlash2 drafter of the same layers (the
  convolutions and the candidate selector added: ``real_size.DFLASH2_FIELDS``), beside the DFlash chain; no
  DDTree (not defined for DFlash2);
- ``dflash2_sampled_rule``: the sampled rule's estimator for that drafter (the selector's law at every slot);
- ``sizes``: feature bytes per token (and what a cache file adds).

With random weights nothing is accepted, so every replay visits every anchor: the replay figures are the upper
bound of what a trained drafter costs (its rounds skip the anchors inside accepted runs); the draft pass, which
drafts at every anchor either way, costs the same.
"""

from __future__ import annotations

import time
from pathlib import Path

from remote_payload.diagnose.gpu_kit import real_size
from remote_payload.diagnose.gpu_kit.part import Part

SIZES = {"gpu": {"tokens": 2048, "prompt": 128, "timed": 3, "decode_context": 1024, "decode_tokens": 32,
                 "decode_batches": (1, 8, 32, 128), "batched_context": 256},
         "smoke": {"tokens": 64, "prompt": 16, "timed": 1, "decode_context": 24, "decode_tokens": 4,
                   "decode_batches": (1, 2, 4), "batched_context": 16}}
CACHE_FILE_EXTRA_BYTES_PER_TOKEN = 16  # token id + the target's argmax, int64 each (inputs/features.py save)


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def measure_extraction(target, layer_ids, size: dict, part_out: dict, save=lambda: None):
    """First call, then ``timed`` calls on fresh token ids; returns the last call's Features. ``save`` writes the
    part after the first call (Triton's compile and autotune), so a step killed later still tells how long it took."""
    from remote_payload.eval.stages import PeakMemory
    from remote_payload.inputs.features import extract

    L, P = size["tokens"], size["prompt"]
    t0 = time.perf_counter()
    feats = extract(target, _tokens(L, target.config.vocab_size, 0), layer_ids, P)
    part_out["first_call_s"] = round(time.perf_counter() - t0, 3)
    if target.device == "cuda":
        import torch

        part_out["cuda_allocated_before_bytes"] = torch.cuda.memory_allocated()  # the weights, mostly
    save()
    memory = PeakMemory(target.device)
    seconds = []
    for i in range(size["timed"]):
        feats = extract(target, _tokens(L, target.config.vocab_size, i + 1), layer_ids, P)
        seconds.append(feats.seconds)
    part_out.update(tokens_per_sample=L, layer_ids=layer_ids, timed_calls=len(seconds), seconds=seconds,
                    tokens_per_s=L * len(seconds) / sum(seconds), **memory.read())
    return feats


def measure_decode(target, size: dict) -> dict:
    """Seconds per greedy token after a prefill of ``decode_context``: (t(1 + n) - t(1)) / n."""
    from remote_payload.inputs.reference import greedy_decode

    ids = _tokens(size["decode_context"], target.config.vocab_size, 99)
    greedy_decode(target, ids, 2)  # warm-up: the single-token kernels compile here
    one = greedy_decode(target, ids, 1)
    n = size["decode_tokens"]
    more = greedy_decode(target, ids, 1 + n)
    per_token = max(more.seconds - one.seconds, 1e-9) / n
    return {"context": len(ids), "new_tokens": n, "prefill_plus_one_s": round(one.seconds, 4),
            "seconds_per_token": per_token, "tokens_per_s": 1 / per_token}


def measure_batched_decode(target, size: dict, out: dict, save=lambda: None) -> None:
    """The reference stage's batched decoding (``inputs.batched_decode``) at each of ``decode_batches`` rows: rows
    of ``batched_context`` random tokens, greedy, no stop; tokens/s from two decodes that differ only in length
    ((t(1 + n) - t(1)) per b·n tokens), the CUDA peak of the longer one. Stops at the first batch that does not
    fit (recorded), so the largest measured is the largest that fits."""
    import torch

    from remote_payload.inputs.batched_decode import Row, decode_rows

    n, ctx = size["decode_tokens"], size["batched_context"]
    cuda = target.device == "cuda"
    out["context"], out["new_tokens"], out["by_batch"] = ctx, n, {}

    def timed(rows) -> float:
        _sync(target.device)
        t0 = time.perf_counter()
        decode_rows(target, rows, len(rows), lambda *a: None, is_oom=lambda e: False)
        _sync(target.device)
        return time.perf_counter() - t0

    for b in size["decode_batches"]:
        rows = [Row(tuple(_tokens(ctx, target.config.vocab_size, 1000 + k)), 1) for k in range(b)]
        try:
            timed(rows)  # warm-up: this batch's shapes
            one = timed(rows)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            more = timed([Row(r.ids, 1 + n) for r in rows])
        except torch.cuda.OutOfMemoryError:
            out["out_of_memory_at"] = b
            if cuda:
                torch.cuda.empty_cache()
            break
        per_step = max(more - one, 1e-9) / n
        out["by_batch"][str(b)] = {"tokens_per_s": b / per_step, "seconds_per_step": per_step,
                                   "cuda_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None}
        save()


WARM_UPS = 2  # untimed draft passes before each timed one (warm_up_draft)


def warm_up_draft(runtime, spec, feats, topk: int) -> None:
    """The untimed passes before a timed draft pass with ``topk``: one on a short sample, then one on the whole
    sample (its batch shapes are the timed pass's; on a GPU their first call pays set-up the short one misses)."""
    from remote_payload.eval.offline import draft_sample

    tokens, P = feats.tokens, feats.prompt_len
    draft_sample(runtime, feats.layers, tokens[:P + 2 * spec.block_size], P, topk=topk)
    draft_sample(runtime, feats.layers, tokens, P, topk=topk)


def measure_chain(runtime, spec, feats, out: dict) -> None:
    """The top-1 draft pass (after ``WARM_UPS`` warm-ups) and the chain replay over one sample, into ``out``."""
    from remote_payload.eval.offline import draft_sample, replay

    tokens, P = feats.tokens, feats.prompt_len
    warm_up_draft(runtime, spec, feats, 1)
    out.update(anchors=len(tokens) - 1 - P, block_size=spec.block_size, warm_ups=WARM_UPS)
    chain = draft_sample(runtime, feats.layers, tokens, P, topk=1)
    t0 = time.perf_counter()
    rounds = replay(chain)
    chain_replay_s = time.perf_counter() - t0
    out["chain"] = {"draft_s": chain.seconds, "replay_s": chain_replay_s, "rounds": len(rounds),
                    "tokens_per_s": out["anchors"] / (chain.seconds + chain_replay_s)}


def measure_drafter(runtime, spec, feats, topk: int, tree: dict, out: dict, save=lambda: None) -> None:
    """Draft pass + replays over one sample, for the chain (top-1) and for the eval's pass with the tree; into ``out``,
    saved after the chain."""
    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.metrics.tree import sample_tree_rounds

    measure_chain(runtime, spec, feats, out)
    save()
    tokens, P = feats.tokens, feats.prompt_len
    warm_up_draft(runtime, spec, feats, topk)  # as the chain's: the top-k pass has its own shapes
    both = draft_sample(runtime, feats.layers, tokens, P, topk=topk)
    t0 = time.perf_counter()
    replay(both)
    trees = sample_tree_rounds(both, **tree)
    replay_s = time.perf_counter() - t0
    out["ddtree"] = {"topk": topk, **tree, "warm_ups": WARM_UPS, "draft_s": both.seconds, "replay_s": replay_s,
                     "rounds_topk": len(trees.topk), "rounds_budgeted": len(trees.budgeted),
                     "tokens_per_s": out["anchors"] / (both.seconds + replay_s)}


def measure_sampled_rule(target, runtime, feats, out: dict) -> None:
    """The sampled rule's estimator on one extracted sample at T = 1 (every token has p > 0 there, so the
    total-probability check holds on any continuation): its seconds by part, the check's error."""
    from remote_payload.eval import sampled_rule as sr
    from remote_payload.inputs.sampling import Sampling

    sampling = Sampling(temperature=1.0)
    tokens, P = feats.tokens, feats.prompt_len
    device = target.device
    _sync(device)
    t0 = time.perf_counter()
    law = sr.TargetLaw(target, tokens, P, sampling)
    _sync(device)
    t1 = time.perf_counter()
    sc = sr.slot_scalars(runtime, runtime.prepare(feats.layers), tokens, P, law, sampling)
    _sync(device)
    t2 = time.perf_counter()
    seg = sr.segment(sc)
    t3 = time.perf_counter()
    out.update(temperature=1.0, anchors=len(tokens) - 1 - P, target_law_s=round(t1 - t0, 3),
               drafter_laws_and_reductions_s=round(t2 - t1, 3), forward_backward_s=round(t3 - t2, 4),
               total_s=round(t3 - t0, 3), tokens_per_s=(len(tokens) - 1 - P) / (t3 - t0),
               check_error=seg.error, tolerance=sr.TOLERANCE,
               expected_rounds=round(sum(r * p for r, p in enumerate(seg.round_count)), 3))


def run(part: Part, mode: str, device: str, kernel: str, work: Path) -> None:
    import torch

    from remote_payload.eval.settings import EvalSettings
    from remote_payload.inputs.features import bytes_per_token
    from remote_payload.models import kernels

    kernels.apply_policy(device, kernel)  # before transformers' modelling code is imported
    size, toy = SIZES[mode], mode == "smoke"
    target = None
    with part.section("build") as out:
        t0 = time.perf_counter()
        target = real_size.build_target(real_size.target_config(toy), device, "bfloat16", work)
        _sync(device)
        params = sum(p.numel() for p in target.model.parameters())
        out.update(seconds=round(time.perf_counter() - t0, 2), parameters=params,
                   weight_bytes=sum(p.numel() * p.element_size() for p in target.model.parameters()),
                   kernel_path=target.kernel_path, kernels=target.kernel_details, layers=target.config.num_layers,
                   hidden_size=target.config.hidden_size, vocab_size=target.config.vocab_size,
                   cuda_allocated_bytes=torch.cuda.memory_allocated() if device == "cuda" else None)
    if target is None or not part.ok("build"):
        return
    if kernel == "fla" and target.kernel_path != "fla":
        part.note(f"fla was requested but the target bound the {target.kernel_path} path: the rates below are that "
                  "path's, not fla's")
    dcfg = real_size.drafter_config(toy)
    layer_ids = list(dcfg["dflash_config"]["target_layer_ids"])
    with part.section("sizes") as out:
        per_token = bytes_per_token(target, layer_ids)
        out.update(feature_bytes_per_token=per_token, cache_file_bytes_per_token=per_token +
                   CACHE_FILE_EXTRA_BYTES_PER_TOKEN, layer_ids=layer_ids, dtype="bfloat16")
    feats = None
    with part.section("extraction") as out:
        feats = measure_extraction(target, layer_ids, size, out, part.save)
    with part.section("decode") as out:
        out.update(measure_decode(target, size))
    with part.section("batched_decode") as out:
        measure_batched_decode(target, size, out, part.save)
    if feats is None or not part.ok("extraction"):
        return
    with part.section("drafter") as out:
        spec, runtime = real_size.drafter_runtime(dcfg, target)
        out["drafter_parameters"] = sum(p.numel() for p in runtime.model.parameters())
        s = EvalSettings(target="", drafters=[])
        measure_drafter(runtime, spec, feats, s.draft_topk, {"k": s.tree_k, "budget": s.tree_budget, "K": s.tree_K},
                        out, part.save)
    if not part.ok("drafter"):
        return
    with part.section("sampled_rule") as out:
        measure_sampled_rule(target, runtime, feats, out)
    del runtime  # one drafter on the device at a time
    if device == "cuda":
        torch.cuda.empty_cache()
    measure_dflash2(part, target, feats, toy, part.data["sections"].get("drafter", {}))


def measure_dflash2(part: Part, target, feats, toy: bool, dflash: dict) -> None:
    """The DFlash2 drafter of the same layers: its chain beside DFlash's, then its sampled-rule estimator."""
    runtime = None
    with part.section("dflash2_drafter") as out:
        spec, runtime = real_size.drafter_runtime(real_size.dflash2_config(toy), target)
        out.update(drafter_parameters=sum(p.numel() for p in runtime.model.parameters()),
                   dflash2_fields=real_size.DFLASH2_FIELDS)
        measure_chain(runtime, spec, feats, out)
        base = (dflash.get("chain") or {}).get("tokens_per_s")
        if base:
            out["chain_rate_vs_dflash"] = out["chain"]["tokens_per_s"] / base
    if runtime is None or not part.ok("dflash2_drafter"):
        return
    with part.section("dflash2_sampled_rule") as out:
        measure_sampled_rule(target, runtime, feats, out)
