"""Probes (``--diagnose``): re-draft the first samples' blocks with one thing changed (slot 0, layer ids,
post-norm state, mask id) and score them against the target's tokens; see ``findings`` for the rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from remote_payload.diagnose.findings import (
    AGREE_OK,
    BETTER_ABS,
    BETTER_REL,
    KNOWN_MASK_IDS,
    MIN_POSITIONS,
    PROBE_ANCHORS_PER_SAMPLE,
    Finding,
)
from remote_payload.diagnose.tensors import round_sig

# A DFlash2 drafter's probes re-draft through its selector's walk, so the slot-0, layer-id, post-norm and mask-id
# probes apply to it as they stand; these do not.
DFLASH2_NOT_PROBED = [
    "the candidate selector itself: no probe swaps or disables it (a selector fault shows only as a low τ)",
    "DDTree: not defined for DFlash2 (no tree over the selector's candidates), so no tree figure is probed",
]


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
                "depth1_accuracy": round_sig(self.hits / self.positions, 4) if self.positions else None,
                "mean_accepted": round_sig(self.accepted / self.anchors, 4) if self.anchors else None,
                **({"agreement_with_as_run": round_sig(self.agree / self.entries, 4)} if self.entries else {})}

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
    spec = runtime.spec
    layer_sets = probe_layer_ids(spec, num_target_layers)
    last = num_target_layers - 1
    masks = mask_candidates(spec, tokenizer, int(runtime.embed.weight.shape[0]))
    scores: dict[str, _Score] = {}
    for smp in samples:
        anchors = _anchors(smp)
        if anchors is None:
            continue
        as_run = smp.as_run[:len(anchors)].cpu()
        for label, feats, kw in _variants(smp, spec, layer_sets, final_norm, masks, last):
            top1 = as_run if feats is None else _redraft(runtime, smp.tokens, anchors, feats, kw)
            scores.setdefault(label, _Score()).add(top1, smp.tokens, anchors, None if feats is None else as_run)
    variants = {label: {**sc.to_json(), **({"layers": layer_sets[label]} if label in layer_sets else {})}
                for label, sc in scores.items()}
    for tid, piece in masks:
        if f"mask={tid}" in variants:
            variants[f"mask={tid}"].update(mask_id=tid, piece=piece)
    scope = {"not_applicable": DFLASH2_NOT_PROBED} if spec.dflash2 is not None else {}
    if "slot0=token" not in scores:
        return {"samples": [s.sample_id for s in samples], "variants": variants, **scope}, []
    findings = _slot0_findings(name, scores) + _layer_findings(name, spec, scores, layer_sets, last) + \
        _mask_findings(name, spec, scores, masks)
    return {"samples": [s.sample_id for s in samples], "anchors_per_sample_max": PROBE_ANCHORS_PER_SAMPLE,
            "metric": "depth-1 top-1 accuracy against the target's tokens; mean_accepted = leading drafts equal to "
                      "the target's tokens per anchor (teacher-forced, every probed anchor)",
            "variants": variants, **scope}, findings


def _anchors(smp: ProbeSample):
    """The probed anchors of a sample (at most PROBE_ANCHORS_PER_SAMPLE), or None when it has none."""
    import torch

    n = min(len(smp.tokens) - 1 - smp.prompt_len, PROBE_ANCHORS_PER_SAMPLE)
    return torch.arange(smp.prompt_len, smp.prompt_len + n) if n > 0 else None


def _variants(smp: ProbeSample, spec, layer_sets: dict, final_norm, masks: list, last: int) -> list[tuple]:
    """(label, features — None for the eval's own drafts —, draft options) for every variant probed."""
    import torch

    configured = {lid: smp.features[lid] for lid in spec.fc_layer_ids}
    plan = [("as-run", None, None), ("slot0=token", configured, {}), ("slot0=mask", configured, {"slot0": "mask"})]
    for label, src in layer_sets.items():
        plan.append((label, {lid: smp.features[s] for lid, s in zip(spec.fc_layer_ids, src, strict=True)}, {}))
    if last in spec.fc_layer_ids and final_norm is not None:
        with torch.inference_mode():
            h = smp.features[last]
            w = final_norm.weight
            post = final_norm(h.to(w.device, w.dtype)).to(h.device, h.dtype)
        plan.append(("last-layer-post-norm", {**configured, last: post}, {}))
    for tid, _piece in masks:
        plan.append((f"mask={tid}", configured, {"mask_id": tid}))
    return plan


def _redraft(runtime, tokens, anchors, feats: dict, options: dict):
    ids, _ = runtime.draft(runtime.prepare(feats), tokens, anchors, topk=1, **options)
    return ids[..., 0].cpu()


def _slot0_findings(name: str, scores: dict) -> list[Finding]:
    findings = []
    base, mask_sc = scores["slot0=token"], scores["slot0=mask"]
    tok_agree = base.agreement
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
    return findings


def _layer_findings(name: str, spec, scores: dict, layer_sets: dict, last: int) -> list[Finding]:
    findings = []
    base = scores["slot0=token"]
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
    return findings


def _mask_findings(name: str, spec, scores: dict, masks: list) -> list[Finding]:
    base = scores["slot0=token"]
    best = max(((tid, piece, scores[f"mask={tid}"]) for tid, piece in masks if f"mask={tid}" in scores),
               key=lambda x: x[2].acc or 0.0, default=None)
    if not (best and _clearly_better(best[2], base)):
        return []
    tid, piece, sc = best
    return [Finding("warning", "mask-id", f"with mask id {tid}" + (f" ({piece!r})" if piece else "")
                    + f" the depth-1 accuracy is {sc.acc:.2f} vs {base.acc:.2f} with the configured "
                    f"{spec.mask_token_id}: the configured mask id is probably wrong (pitfall 3); fix "
                    "dflash_config.mask_token_id (or --drafter-spec NAME=FILE with mask_token_id)", name)]
