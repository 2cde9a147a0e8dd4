"""Why does a drafter accept less than it should? Checks for the pitfalls of the table in docs/troubleshooting.md
(numbered there: "pitfall N" below is its row N).

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

This module: the decision rules, the finding codes, the run checks and the static facts about a drafter.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Sequence

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
    "kernel-path-mismatch": "features from another linear-attention path than the drafter was trained on (pitfall 7; "
                            "measured: ~0.5% hidden-state drift, τ within ±0.06)",
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
    "last-layer-post-norm": "the last layer's post-norm state (HF's last hidden_states entry) gives clearly better "
                            "drafts (pitfall 1)",
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
    enable_thinking: bool | str  # or "both" (--enable-thinking both)
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
                           f"the {facts.kernel_path} path. Measured on the tiny hybrid fixture "
                           f"(benchmarks/kernel_path.py, 12 samples, a drafter trained on fla bf16 features): the "
                           f"paths' hidden states differ by "
                           f"0.3-0.7% per layer (about bf16's own rounding), 0.5% of top-1 drafts flip, and τ moves "
                           f"by +0.01 [95% CI 0.00, 0.02] on torch bf16 and +0.02 [0.00, 0.06] on torch fp32 "
                           f"features: not enough to make a drafter look broken, so look for another cause first. "
                           f"On a CPU host prefer --dtype float32 (no eval-side bf16 rounding; bf16 is no faster on "
                           f"CPU); a full-size target may drift more with depth and length, so confirm headline "
                           f"numbers on a host that binds {kp}"
                           + (" (a CUDA host with flash-linear-attention)" if kp == "fla" else " (--kernel torch)"),
                           name))
    th = metadata.get("enable_thinking")
    if th is not None and th != facts.enable_thinking and facts.enable_thinking != "both":  # both: one mode is it
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
