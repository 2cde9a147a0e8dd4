"""Why does a drafter accept less than it should? Checks for the pitfalls of design note section 6.

Two layers (README "Diagnostics"):

- **Run checks**, always on and free: the run against what the drafter's ``training`` metadata says about
  its training (features from the fla or the torch linear-attention path, thinking mode, chat template),
  float16 numerics (only reachable with ``--allow-fp16``), and position-1 acceptance against an expected
  value (``--expect-p1`` or ``training.expected_p1``). They become warnings.
- **``--diagnose``**: statistics of the target's hidden states per layer used and of each drafter's fc
  projection, the checkpoint's embed_tokens/lm_head copies against the target's, facts about the mask
  token, decoded drafts next to the target's tokens for the first rounds of the first samples, and
  *probes*. A probe re-drafts the blocks of those samples with one thing changed — slot 0 filled with the
  mask, the target layer ids shifted by ±1, the last layer's post-norm state, another mask id — and
  scores depth-1 top-1 accuracy against the target's tokens. A variant that is clearly better than the
  design's block names the pitfall the drafter was trained (or configured) with; and the drafts the eval
  actually used must equal a re-draft of the design's block, else the harness built other blocks (e.g. a
  mask-filled slot 0).

Findings carry a stable ``code`` (``FINDING_CODES``) so the controller and tests need not parse prose.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

# Probe decision rules: an alternative is "clearly better" when its depth-1 accuracy exceeds the design's
# block by at least BETTER_ABS absolute and BETTER_REL relative, over at least MIN_POSITIONS positions.
BETTER_ABS = 0.10
BETTER_REL = 1.25
MIN_POSITIONS = 32
# As-run drafts vs a re-draft of the same blocks: equal up to near-tied logits flipping under another batch.
AGREE_OK = 0.98
# Position-1 acceptance "far below" the expected value.
P1_FAR_BELOW = 0.6
PROBE_ANCHORS_PER_SAMPLE = 512
FP16_MAX = 65504.0
FP16_NAMES = ("float16", "fp16", "half")
# Mask ids of released DFlash drafters (Qwen3; Qwen3.5/3.6 by revision): tried as alternatives when in range.
KNOWN_MASK_IDS = (151669, 248070, 248077)

FINDING_CODES = {
    "kernel-path-mismatch": "features from another linear-attention path than the drafter was trained on (pitfall 7)",
    "thinking-mismatch": "thinking mode differs from the drafter's training (pitfall 4)",
    "chat-template-mismatch": "chat template differs from the drafter's training (pitfall 4)",
    "fp16-run": "target and drafter run in float16 (pitfall 5)",
    "fp16-weights": "drafter weights stored in float16 (pitfall 5)",
    "p1-below-expected": "position-1 acceptance far below the expected value",
    "no-training-metadata": "the drafter carries no training metadata to check the run against",
    "nonfinite-features": "NaN/inf in the target's hidden states",
    "fp16-range": "hidden states beyond float16's range",
    "nonfinite-fc": "NaN/inf in the drafter's fc projection",
    "embedding-mismatch": "the checkpoint's embed_tokens/lm_head copies differ from the target's",
    "mask-token": "facts about the mask token (pitfall 3)",
    "mask-in-text": "the mask token occurs in prompts or continuations (pitfall 3)",
    "mask-id": "another mask id gives clearly better drafts (pitfall 3)",
    "slot0-harness": "the eval's drafts equal drafts with a mask-filled slot 0 (pitfall 2)",
    "slot0-trained-masked": "the drafter drafts better with slot 0 mask-filled: trained that way? (pitfall 2)",
    "drafts-inconsistent": "the eval's drafts differ from a re-draft of the same blocks",
    "layer-shift": "target layer ids shifted by one give clearly better drafts (pitfall 1)",
    "layer-ids-look-shifted": "target layer ids equal z-lab's default spread shifted by one (pitfall 1)",
    "last-layer-post-norm": "the last layer's post-norm state gives clearly better drafts (design note section 2)",
}


@dataclass
class Finding:
    severity: str  # "warning" | "info"
    code: str
    message: str
    drafter: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        who = f"drafter '{self.drafter}': " if self.drafter else ""
        return f"[{self.code}] {who}{self.message}"


def template_sha256(tokenizer) -> str | None:
    tpl = getattr(tokenizer, "chat_template", None)
    if tpl is None:
        return None
    text = tpl if isinstance(tpl, str) else json.dumps(tpl, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------- run checks


@dataclass
class RunFacts:
    """What the run checks compare a drafter's training metadata with."""
    kernel_path: str
    enable_thinking: bool
    dtype: str
    chat_template_sha256: str | None


def run_level_checks(facts: RunFacts) -> list[Finding]:
    if facts.dtype in FP16_NAMES:
        return [Finding("warning", "fp16-run", "the run uses float16 (forced with --allow-fp16): DFlash drafters and "
                        "Qwen3.x targets are trained in bfloat16 and fp16's narrow range has given ~0% acceptance; "
                        "rerun with --dtype bfloat16")]
    return []


def drafter_checks(name: str, spec, metadata: dict | None, facts: RunFacts) -> list[Finding]:
    """Metadata-declared mismatches and fp16 weights of one drafter (cheap, always on)."""
    out: list[Finding] = []
    if spec.weights_dtype and "float16" in spec.weights_dtype.split(","):
        out.append(Finding("warning", "fp16-weights", f"weights are stored in float16 (accepted with --allow-fp16); "
                           f"they run in {facts.dtype} here, but a drafter saved in fp16 may have been trained or "
                           "exported with fp16 overflow: compare with a bfloat16 export", name))
    if not metadata:
        return out
    kp = metadata.get("feature_kernel_path")
    if kp and kp != facts.kernel_path:
        out.append(Finding("warning", "kernel-path-mismatch", f"trained on target features from the {kp} "
                           f"linear-attention kernels (training.feature_kernel_path) but this run extracts them with "
                           f"the {facts.kernel_path} path; the two differ numerically and a drafter can look broken "
                           f"on the other path — evaluate on a host that binds {kp}"
                           + (" (a CUDA host with flash-linear-attention)" if kp == "fla" else " (--kernel torch)"),
                           name))
    th = metadata.get("enable_thinking")
    if th is not None and th != facts.enable_thinking:
        out.append(Finding("warning", "thinking-mismatch", f"trained with enable_thinking={str(th).lower()} "
                           f"(training.enable_thinking) but this run renders prompts with "
                           f"enable_thinking={str(facts.enable_thinking).lower()}: the chat template differs from "
                           "training (acceptance 60% -> 25% in one report); rerun with "
                           + ("--enable-thinking" if th else "--no-enable-thinking"), name))
    sha = metadata.get("chat_template_sha256")
    if sha and facts.chat_template_sha256 and sha.lower() != facts.chat_template_sha256:
        out.append(Finding("warning", "chat-template-mismatch", f"trained with a chat template of sha256 "
                           f"{sha[:12]}… (training.chat_template_sha256), the target's tokenizer has "
                           f"{facts.chat_template_sha256[:12]}…: prompts are rendered differently from training",
                           name))
    return out


def p1_check(name: str, metrics: dict, expected: float | None, source: str | None) -> Finding | None:
    """Position-1 acceptance of the chain replay against an expected value (flag or metadata)."""
    if expected is None:
        return None
    pos = metrics.get("per_position") or []
    p1 = pos[0].get("p") if pos else None
    if p1 is None or p1 >= P1_FAR_BELOW * expected:
        return None
    return Finding("warning", "p1-below-expected", f"position-1 acceptance {p1:.3f} is far below the {expected:.3f} "
                   f"expected from training ({source}); below {P1_FAR_BELOW:.0%} of it the cause is usually a "
                   "setup pitfall (layer ids, mask id, slot 0, thinking mode, kernel path, dtype), not the "
                   "drafter's quality: see the other findings (--diagnose probes each pitfall)", name)


# ----------------------------------------------------------------------------------------- statistics


class TensorStats:
    """Streaming mean / std / abs-max / NaN / inf count of every element of the tensors added."""

    def __init__(self):
        self.count = 0  # finite values
        self.sum = 0.0
        self.sumsq = 0.0
        self.abs_max = 0.0
        self.nan = 0
        self.inf = 0

    def add(self, t) -> None:
        import torch

        x = t.detach()
        if not x.is_floating_point():
            x = x.float()
        nan, inf = torch.isnan(x), torch.isinf(x)
        self.nan += int(nan.sum())
        self.inf += int(inf.sum())
        finite = x[~(nan | inf)].double()
        if finite.numel():
            self.count += finite.numel()
            self.sum += float(finite.sum())
            self.sumsq += float((finite * finite).sum())
            self.abs_max = max(self.abs_max, float(finite.abs().max()))

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    def to_json(self) -> dict:
        n = self.count
        mean = self.sum / n if n else None
        std = math.sqrt(max(0.0, self.sumsq / n - mean * mean)) if n else None
        return {"mean": _r(mean), "std": _r(std), "rms": _r(math.sqrt(self.sumsq / n) if n else None),
                "abs_max": _r(self.abs_max if n else None), "nan": self.nan, "inf": self.inf,
                "values": n + self.nan + self.inf}


def _r(x, digits: int = 6):
    return None if x is None else float(f"{x:.{digits}g}")


def stats_findings(layer_stats: dict, dtype: str) -> list[Finding]:
    out = []
    bad = {lid: s for lid, s in layer_stats.items() if s.nonfinite}
    if bad:
        out.append(Finding("warning", "nonfinite-features", "the target's hidden states hold NaN/inf at layer(s) "
                           + ", ".join(f"{lid} ({s.nan} NaN, {s.inf} inf)" for lid, s in sorted(bad.items()))
                           + f" ({dtype}): the target's numerics are broken (fp16 overflow? a kernel fault?); every "
                           "draft built on them is noise"))
    big = sorted(lid for lid, s in layer_stats.items() if s.abs_max > FP16_MAX)
    if big:
        fp16 = dtype in FP16_NAMES
        out.append(Finding("warning" if fp16 else "info", "fp16-range",
                           f"hidden states at layer(s) {big} exceed float16's range ({FP16_MAX:g}): they overflow "
                           "in float16" + ("; this run IS float16" if fp16 else " (fine in bfloat16/float32)")))
    return out


# ----------------------------------------------------------------------------------------- static facts


def mask_facts(name: str, spec, tokenizer, embed_rows: int, texts: Sequence[Sequence[int]]) -> tuple[dict, list]:
    """What the mask id is in this tokenizer, and whether it occurs in the eval's text."""
    mask = spec.mask_token_id
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    if mask in added:
        kind, piece = "added special token", added[mask].content
    elif mask < len(tokenizer):
        kind, piece = "regular vocabulary token", tokenizer.convert_ids_to_tokens(mask)
    elif mask < embed_rows:
        kind, piece = "beyond the tokenizer (an embedding row no text maps to)", None
    else:
        kind, piece = "outside the embedding table", None
    occurrences = sum(int(t == mask) for seq in texts for t in seq)
    facts = {"id": mask, "piece": piece, "kind": kind, "occurrences_in_text": occurrences,
             "tokenizer_size": len(tokenizer), "embedding_rows": embed_rows}
    findings = [Finding("info", "mask-token", f"mask id {mask}"
                        + (f" = {piece!r}" if piece is not None else "") + f": {kind}", name)]
    if occurrences:
        findings.append(Finding("warning", "mask-in-text", f"the mask id {mask} occurs {occurrences} time(s) in the "
                                "prompts/continuations: it is a real token here, so drafts cannot tell masked slots "
                                "from text", name))
    return facts, findings


def layer_id_heuristic(name: str, spec, num_target_layers: int) -> Finding | None:
    """Ids equal to z-lab's default spread shifted by one: the typical speculators/z-lab id confusion."""
    from remote_payload.models.spec import zlab_default_layer_ids

    ids = list(spec.fc_layer_ids) + list(spec.reserved_layer_ids)
    default = zlab_default_layer_ids(num_target_layers, len(ids))
    if len(ids) < 2 or ids == default:
        return None
    if ids == [i + 1 for i in default]:
        return Finding("warning", "layer-ids-look-shifted", f"target layer ids {ids} are z-lab's default {default} "
                       "plus one: HF hidden_states indices (speculators-style) where decoder-layer ids are expected? "
                       "See the layer-shift probe", name)
    if ids == [i - 1 for i in default]:
        return Finding("warning", "layer-ids-look-shifted", f"target layer ids {ids} are z-lab's default {default} "
                       "minus one: decoder-layer ids written into a speculators config (which expects ids + 1)? "
                       "See the layer-shift probe", name)
    return None


def embedding_comparison(name: str, loaded, target) -> tuple[dict, list]:
    """The checkpoint's embed_tokens / lm_head copies against the target's, when the checkpoint has them."""
    import torch

    out: dict = {}
    findings: list[Finding] = []
    used = {"embed_tokens.weight": loaded.spec.embed_source, "lm_head.weight": loaded.spec.lm_head_source}
    pairs = (("embed_tokens.weight", target.model.get_input_embeddings().weight),
             ("lm_head.weight", target.model.get_output_embeddings().weight))
    for key, theirs in pairs:
        ours = loaded.extras.get(key)
        if ours is None:
            out[key] = None
            continue
        rows = None
        if key == "lm_head.weight" and loaded.spec.vocab_map == "d2t" and "d2t" in loaded.extras:
            d2t = loaded.extras["d2t"].to(torch.int64)
            rows = torch.arange(d2t.shape[0]) + d2t  # draft row i holds target row i + d2t[i]
        res = _compare_rows(ours, theirs, rows)
        res["used_by_the_eval"] = used[key] == "checkpoint"
        out[key] = res
        if not res["match"]:
            who = ("the drafter drafts with these copies" if res["used_by_the_eval"] else
                   "the eval uses the target's, but the drafter was trained next to these")
            findings.append(Finding("warning", "embedding-mismatch", f"the checkpoint's {key.split('.')[0]} differs "
                                    f"from the target's ({res['detail']}); {who}: trained against other target "
                                    "weights (another revision?) or the wrong target is loaded", name))
    return out, findings


def _compare_rows(ours, theirs, rows=None, chunk: int = 32768) -> dict:
    import torch

    theirs_rows = theirs.shape[0] if rows is None else None
    n = ours.shape[0] if rows is not None else min(ours.shape[0], theirs.shape[0])
    if ours.dim() != 2 or ours.shape[1] != theirs.shape[1]:
        return {"match": False, "shape": list(ours.shape), "target_shape": list(theirs.shape),
                "detail": f"shape {list(ours.shape)} vs {list(theirs.shape)}"}
    dev = theirs.device
    scale = max(float(theirs.detach()[i:i + chunk].abs().amax()) for i in range(0, theirs.shape[0], chunk))
    tol = max(1e-6, 1e-2 * scale)  # bf16 rounding of the same weights stays well inside 1% of the range
    max_diff, differing = 0.0, 0
    for start in range(0, n, chunk):
        a = ours[start:start + chunk].to(dev, torch.float32)
        idx = torch.arange(start, min(n, start + chunk)) if rows is None else rows[start:start + chunk]
        b = theirs.detach()[idx.to(dev)].float()
        d = (a - b).abs().amax(dim=1)
        max_diff = max(max_diff, float(d.max()))
        differing += int((d > tol).sum())
    shape_ok = rows is not None or ours.shape[0] == theirs_rows
    match = differing == 0 and shape_ok
    detail = (f"{differing} of {n} rows differ by more than {tol:.3g}, max |Δ| {max_diff:.3g}" if differing else
              f"max |Δ| {max_diff:.3g}")
    if not shape_ok:
        detail = f"{ours.shape[0]} rows vs the target's {theirs_rows}; over the common rows: {detail}"
    return {"match": match, "shape": list(ours.shape), "target_shape": list(theirs.shape), "max_abs_diff":
            _r(max_diff), "rows_differing": differing, "tolerance": _r(tol), "detail": detail}


# ----------------------------------------------------------------------------------------- probes


@dataclass
class ProbeSample:
    """One diagnosed sample: tokens, features (configured and extra layers) and the eval's own top-1 drafts."""
    sample_id: str
    tokens: list[int]
    prompt_len: int
    features: dict  # layer id -> [S, H]
    as_run: Any  # LongTensor [A, B-1]: top-1 drafts at anchors prompt_len..len(tokens)-2


@dataclass
class _Score:
    positions: int = 0  # depth-1 positions scored
    hits: int = 0
    accepted: int = 0  # leading matches summed over anchors
    anchors: int = 0
    agree: int = 0  # entries equal to the as-run drafts
    entries: int = 0

    def add(self, top1, tokens, anchors, as_run=None) -> None:
        import torch

        A, D = top1.shape
        pos = anchors[:, None] + torch.arange(1, D + 1)[None]
        valid = pos < len(tokens)
        tok = torch.tensor(tokens)
        truth = torch.where(valid, tok[pos.clamp(max=len(tokens) - 1)], torch.full_like(pos, -1))
        match = (top1 == truth) & valid
        self.positions += A
        self.hits += int(match[:, 0].sum())
        self.accepted += int(match.long().cumprod(dim=1).sum())
        self.anchors += A
        if as_run is not None:
            self.agree += int((top1 == as_run).sum())
            self.entries += top1.numel()

    def to_json(self) -> dict:
        return {"positions": self.positions,
                "depth1_accuracy": _r(self.hits / self.positions, 4) if self.positions else None,
                "mean_accepted": _r(self.accepted / self.anchors, 4) if self.anchors else None,
                **({"agreement_with_as_run": _r(self.agree / self.entries, 4)} if self.entries else {})}

    @property
    def acc(self) -> float | None:
        return self.hits / self.positions if self.positions else None

    @property
    def agreement(self) -> float | None:
        return self.agree / self.entries if self.entries else None


def _clearly_better(alt: _Score, base: _Score) -> bool:
    if alt.acc is None or base.acc is None or min(alt.positions, base.positions) < MIN_POSITIONS:
        return False
    return alt.acc >= base.acc + BETTER_ABS and alt.acc >= BETTER_REL * base.acc


def probe_layer_ids(spec, num_target_layers: int) -> dict[str, list[int]]:
    """Layer sets the probes need besides the configured one: label -> source layer per fc slot."""
    ids = list(spec.fc_layer_ids)
    variants = {}
    for delta, label in ((-1, "layers-1"), (1, "layers+1")):
        shifted = [i + delta for i in ids]
        if all(0 <= i < num_target_layers for i in shifted):
            variants[label] = shifted
    return variants


def mask_candidates(spec, tokenizer, embed_rows: int) -> list[tuple[int, str | None]]:
    """Other plausible mask ids: added tokens named like a mask, and released drafters' mask ids in range."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    out = {tid: tok.content for tid, tok in added.items() if "mask" in str(tok.content).lower()}
    for tid in KNOWN_MASK_IDS:
        if tid < embed_rows:
            out.setdefault(tid, added[tid].content if tid in added else None)
    out.pop(spec.mask_token_id, None)
    return sorted((tid, piece) for tid, piece in out.items() if tid < embed_rows)


def run_probes(name: str, runtime, samples: Sequence[ProbeSample], *, num_target_layers: int, final_norm,
               tokenizer) -> tuple[dict, list]:
    """Re-draft the diagnosed samples' blocks with one thing changed at a time; see the module doc."""
    import torch

    spec = runtime.spec
    embed_rows = int(runtime.embed.weight.shape[0])
    variants: dict[str, dict] = {}
    scores: dict[str, _Score] = {}
    layer_sets = probe_layer_ids(spec, num_target_layers)
    last = num_target_layers - 1
    masks = mask_candidates(spec, tokenizer, embed_rows)

    def describe(label):
        if label in layer_sets:
            return {"layers": layer_sets[label]}
        return {}

    for smp in samples:
        A = len(smp.tokens) - 1 - smp.prompt_len
        n = min(A, PROBE_ANCHORS_PER_SAMPLE)
        if n <= 0:
            continue
        anchors = torch.arange(smp.prompt_len, smp.prompt_len + n)
        as_run = smp.as_run[:n].cpu()
        configured = {lid: smp.features[lid] for lid in spec.fc_layer_ids}

        def redraft(feats, **kw):
            ctx = runtime.prepare(feats)
            ids, _ = runtime.draft(ctx, smp.tokens, anchors, topk=1, **kw)
            return ids[..., 0].cpu()

        plan = [("as-run", None, None), ("slot0=token", configured, {}), ("slot0=mask", configured,
                                                                         {"slot0": "mask"})]
        for label, src in layer_sets.items():
            plan.append((label, {lid: smp.features[s] for lid, s in zip(spec.fc_layer_ids, src)}, {}))
        if last in spec.fc_layer_ids and final_norm is not None:
            with torch.inference_mode():
                h = smp.features[last]
                w = final_norm.weight
                post = final_norm(h.to(w.device, w.dtype)).to(h.device, h.dtype)
            plan.append(("last-layer-post-norm", {**configured, last: post}, {}))
        for tid, _piece in masks:
            plan.append((f"mask={tid}", configured, {"mask_id": tid}))
        for label, feats, kw in plan:
            top1 = as_run if feats is None else redraft(feats, **kw)
            scores.setdefault(label, _Score()).add(top1, smp.tokens, anchors,
                                                   None if feats is None else as_run)

    for label, sc in scores.items():
        variants[label] = {**sc.to_json(), **describe(label)}
    for tid, piece in masks:
        if f"mask={tid}" in variants:
            variants[f"mask={tid}"].update(mask_id=tid, piece=piece)

    findings: list[Finding] = []
    base = scores.get("slot0=token")
    if base is None:
        return {"samples": [s.sample_id for s in samples], "variants": variants}, findings
    tok_agree = base.agreement
    mask_sc = scores["slot0=mask"]
    if tok_agree is not None and tok_agree < AGREE_OK:
        if mask_sc.agreement is not None and mask_sc.agreement >= AGREE_OK:
            findings.append(Finding("warning", "slot0-harness", f"the eval's drafts equal re-drafts with the MASK "
                                    f"token in block slot 0 ({mask_sc.agreement:.1%} agreement) and differ from "
                                    f"re-drafts with the committed token there ({tok_agree:.1%}): the eval built its "
                                    "blocks with a mask-filled slot 0 (pitfall 2: τ 1.46 vs 6.34 in one report)",
                                    name))
        else:
            findings.append(Finding("warning", "drafts-inconsistent", f"the eval's drafts agree with a re-draft of the "
                                    f"same blocks at only {tok_agree:.1%} of positions (expected ~100%): "
                                    "nondeterministic numerics or blocks built differently from the design", name))
    if _clearly_better(mask_sc, base):
        findings.append(Finding("warning", "slot0-trained-masked", f"with slot 0 mask-filled the drafter's depth-1 "
                                f"accuracy is {mask_sc.acc:.2f} vs {base.acc:.2f} with the committed token: it was "
                                "probably trained with a mask-filled slot 0 (pitfall 2) — a training-side bug", name))
    best = max(((lbl, scores[lbl]) for lbl in layer_sets if lbl in scores), key=lambda x: x[1].acc or 0.0,
               default=None)
    if best and _clearly_better(best[1], base):
        lbl, sc = best
        direction = "-1" if lbl == "layers-1" else "+1"
        findings.append(Finding("warning", "layer-shift", f"feeding fc the target layers {layer_sets[lbl]} (configured "
                                f"ids {direction}) gives depth-1 accuracy {sc.acc:.2f} vs {base.acc:.2f} with the "
                                f"configured {list(spec.fc_layer_ids)} ({spec.layer_ids_source}): the ids look shifted "
                                "by one — HF hidden_states indices vs decoder-layer ids (pitfall 1)", name))
    post = scores.get("last-layer-post-norm")
    if post is not None and _clearly_better(post, base):
        findings.append(Finding("warning", "last-layer-post-norm", f"giving fc the target's final-norm output for "
                                f"its last layer {last} gives depth-1 accuracy {post.acc:.2f} vs {base.acc:.2f}: the "
                                "drafter was trained on HF hidden_states[N] (post-norm) for that layer, not the "
                                "decoder layer's own output", name))
    best_mask = max(((tid, piece, scores[f"mask={tid}"]) for tid, piece in masks if f"mask={tid}" in scores),
                    key=lambda x: x[2].acc or 0.0, default=None)
    if best_mask and _clearly_better(best_mask[2], base):
        tid, piece, sc = best_mask
        findings.append(Finding("warning", "mask-id", f"with mask id {tid}" + (f" ({piece!r})" if piece else "")
                                + f" the depth-1 accuracy is {sc.acc:.2f} vs {base.acc:.2f} with the configured "
                                f"{spec.mask_token_id}: the configured mask id is probably wrong (pitfall 3); fix "
                                "dflash_config.mask_token_id (or --drafter-spec NAME=FILE with mask_token_id)", name))
    return {"samples": [s.sample_id for s in samples], "anchors_per_sample_max": PROBE_ANCHORS_PER_SAMPLE,
            "metric": "depth-1 top-1 accuracy against the target's tokens; mean_accepted = leading drafts equal to "
                      "the target's tokens per anchor (teacher-forced, every probed anchor)",
            "variants": variants}, findings


# ----------------------------------------------------------------------------------------- decoded rounds


def _piece(tokenizer, tid: int) -> str:
    return tokenizer.decode([int(tid)], skip_special_tokens=False)


def decoded_rounds(tokenizer, sample_id: str, tokens: Sequence[int], as_run_top1, prompt_len: int, rounds,
                   limit: int) -> dict:
    """The first ``limit`` chain rounds: the anchor, the drafts and the target's tokens, decoded."""
    out = []
    for n, r in enumerate(rounds[:limit]):
        row = as_run_top1[r.anchor - prompt_len].tolist()
        target = list(tokens[r.anchor + 1:r.anchor + 1 + len(row)])
        out.append({"round": n + 1, "anchor": r.anchor, "anchor_token": _piece(tokenizer, tokens[r.anchor]),
                    "accepted": r.accepted, "produced": r.produced, "drafts": row, "target": target,
                    "drafts_text": [_piece(tokenizer, t) for t in row],
                    "target_text": [_piece(tokenizer, t) for t in target]})
    return {"sample": sample_id, "rounds": out}


# ----------------------------------------------------------------------------------------- report


@dataclass
class DrafterDiagnostics:
    name: str
    spec: Any
    fc_pre_norm: TensorStats = field(default_factory=TensorStats)
    fc_output: TensorStats = field(default_factory=TensorStats)
    metadata: dict | None = None
    mask: dict | None = None
    embeddings: dict | None = None
    probes: dict | None = None
    drafts: list = field(default_factory=list)
    p1: dict | None = None

    def add_fc(self, runtime, features) -> None:
        import torch

        with torch.inference_mode():
            pre = runtime.model.fc(runtime.fc_input(features))
            self.fc_pre_norm.add(pre)
            self.fc_output.add(runtime.model.hidden_norm(pre))

    def to_json(self) -> dict:
        s = self.spec
        return {"format": s.format, "block_size": s.block_size, "fc_layer_ids": list(s.fc_layer_ids),
                "reserved_layer_ids": list(s.reserved_layer_ids), "layer_ids_source": s.layer_ids_source,
                "attention": [{"kind": a.kind, "window": a.window, "causal": a.causal} for a in s.attn],
                "weights_dtype": s.weights_dtype, "training_metadata": self.metadata, "mask": self.mask,
                "fc_output": self.fc_output.to_json(), "fc_pre_norm": self.fc_pre_norm.to_json(),
                "embeddings": self.embeddings, "p1": self.p1, "probes": self.probes, "drafts": self.drafts}


def _fmt(x, spec: str = ".4g") -> str:
    return "–" if x is None else format(x, spec)


def _stats_row(label: str, st: dict) -> str:
    return (f"  {label:>8}  {_fmt(st['mean'], '>10.4g')}  {_fmt(st['std'], '>10.4g')}  {_fmt(st['abs_max'], '>10.4g')}"
            f"  {st['nan']:>5}  {st['inf']:>5}")


def render_text(diag: dict) -> str:
    """The readable report (printed at the end of the run and kept as diagnostics["text"])."""
    lines = [f"dfo diagnostics — {len(diag['samples'])} sample(s) probed: {', '.join(diag['samples']) or 'none'}"]
    findings = diag.get("findings") or []
    lines += ["", "Findings" + ("" if findings else ": none")]
    for f in findings:
        lines.append(f"  {f['severity'].upper():<7} [{f['code']}] " + (f"'{f['drafter']}': " if f["drafter"] else "")
                     + f["message"])
    hs = diag.get("hidden_states") or {}
    lines += ["", f"Target hidden states (decoder-layer outputs; {hs.get('samples')} sample(s), {hs.get('positions')} "
              f"positions, {hs.get('dtype')}, kernel path {hs.get('kernel_path')})",
              f"  {'layer':>8}  {'mean':>10}  {'std':>10}  {'abs-max':>10}  {'nan':>5}  {'inf':>5}"]
    for lid, st in (hs.get("layers") or {}).items():
        lines.append(_stats_row(str(lid), st))
    for name, d in (diag.get("drafters") or {}).items():
        mask = d.get("mask") or {}
        lines += ["", f"Drafter '{name}' ({d['format']}, block {d['block_size']}, fc layers {d['fc_layer_ids']}"
                  + (f", reserved {d['reserved_layer_ids']}" if d["reserved_layer_ids"] else "")
                  + f", weights {d['weights_dtype']})",
                  f"  mask id {mask.get('id')}" + (f" = {mask['piece']!r}" if mask.get("piece") is not None else "")
                  + f": {mask.get('kind')}; in the eval's text {mask.get('occurrences_in_text')} time(s)",
                  "  attention: " + ", ".join(f"{a['kind'].split('_')[0]}"
                                              + (f"(window {a['window']})" if a["window"] else "")
                                              + ("/causal" if a["causal"] else "/bidirectional")
                                              for a in d["attention"]),
                  f"  training metadata: {json.dumps(d['training_metadata']) if d['training_metadata'] else 'none'}",
                  f"  {'fc':>8}  {'mean':>10}  {'std':>10}  {'abs-max':>10}  {'nan':>5}  {'inf':>5}",
                  _stats_row("fc(x)", d["fc_pre_norm"]), _stats_row("normed", d["fc_output"])]
        emb = d.get("embeddings") or {}
        for key, res in emb.items():
            label = key.split(".")[0]
            if res is None:
                lines.append(f"  {label}: from the target (no copy in the checkpoint)")
            else:
                lines.append(f"  {label}: checkpoint copy {'matches' if res['match'] else 'DIFFERS FROM'} the target's "
                             f"({res['detail']}){'; used for drafting' if res.get('used_by_the_eval') else ''}")
        p1 = d.get("p1")
        if p1:
            lines.append(f"  position-1 acceptance {_fmt(p1.get('measured'), '.3f')}"
                         + (f", expected {p1['expected']:.3f} ({p1['expected_source']})" if p1.get("expected")
                            else " (no expected value: --expect-p1 or training.expected_p1)"))
        probes = (d.get("probes") or {}).get("variants") or {}
        if probes:
            lines.append(f"  probes (re-drafted blocks; depth-1 accuracy, mean accepted, agreement with the eval's "
                         "drafts):")
            for label, v in probes.items():
                extra = f"  layers {v['layers']}" if "layers" in v else ""
                if "piece" in v and v["piece"] is not None:
                    extra = f"  {v['piece']!r}"
                agree = v.get("agreement_with_as_run")
                lines.append(f"    {label:<22} {_fmt(v['depth1_accuracy'], '>6.3f')}  "
                             f"{_fmt(v['mean_accepted'], '>6.3f')}  {'' if agree is None else format(agree, '>7.1%')}"
                             f"{extra}")
        for smp in d.get("drafts") or []:
            lines.append(f"  first rounds of {smp['sample']} ([drafts] in brackets differ from the target's token):")
            for r in smp["rounds"]:
                lines.append(f"    round {r['round']} @ {r['anchor']} after {r['anchor_token']!r}: accepted "
                             f"{r['accepted']}/{len(r['drafts'])}")
                lines.append("      draft : " + " ".join(_mark(t, ok) for t, ok in
                                                         zip(r["drafts_text"], _oks(r["drafts"], r["target"]))))
                lines.append("      target: " + " ".join(repr(t) for t in r["target_text"]))
    lines += ["", "Probe rule: a variant is flagged when its depth-1 accuracy is >= "
              f"{BETTER_ABS:g} above and >= {BETTER_REL:g}x the design's block (slot0=token) over >= {MIN_POSITIONS} "
              f"positions; the eval's drafts must agree with slot0=token at >= {AGREE_OK:.0%}."]
    return "\n".join(lines)


def _oks(drafts, target):
    return [i < len(target) and d == target[i] for i, d in enumerate(drafts)]


def _mark(text: str, ok: bool) -> str:
    return repr(text) if ok else f"[{text!r}]"
