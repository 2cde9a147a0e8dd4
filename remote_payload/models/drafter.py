"""The DFlash drafter forward, batched over many draft blocks with explicit boolean masks (SDPA).

One draft block at anchor position a:
- context rows c = hidden_norm(fc(features[p])) for committed positions p < a, shared by every layer
  (projected to K/V per layer, never run through the decoder stack);
- block = [token at a, mask × (B-1)] embedded with the target's (or the checkpoint's) embedding table;
- each layer: Q from the block, K/V from [context; block], RoPE at absolute positions
  (context at p, block at a..a+B-1); full layers bidirectional inside the block, sliding layers
  causal or not as the checkpoint says, with the window applied to both context and block keys;
- logits = lm_head(norm(x)) on slots 1..B-1; slot j predicts the token at position a+j.

Many blocks (e.g. one per anchor of a whole continuation) run as one flat query sequence with a mask
that lets block g see only its own slots and context p < a_g: this is the offline fast path, and the
online loop calls the same code with a single block, so the two paths cannot drift apart.

Draft sources share one interface (the synthetic test drafter implements it too)::

    block_size: int
    prepare(features: dict[layer id -> Tensor[S, H]]) -> context object
    draft(context, tokens: Sequence[int], anchors: Sequence[int], topk: int) -> (ids, logprobs)
        ids: LongTensor [A, B-1, topk] target-vocabulary ids, best first; logprobs: FloatTensor, same shape
    slot_logprobs(context, tokens, anchors, sampling) -> FloatTensor [A, B-1, V]
        log q_{a,j}(v) over the target's vocabulary: the law a sampled-rule round draws slot j's draft from
        (the drafter's logits processed like the target's: / T, top-k, top-p), -inf outside its support; on
        the drafter's device, float32 (``eval/sampled_rule.py`` reduces it there, anchors chunked)
    draw_block(context, tokens, anchor, sampling, generator) -> (drafts: list[int], q: FloatTensor [B-1, V])
        one sampled-rule block at ``anchor`` for the online loop: the drafts drawn from ``generator`` and, per
        slot, the law each was drawn from (CPU float32 probabilities). DFlash's slots are independent given the
        anchor; a drafter whose slot law depends on the previous draft draws them in turn

``DrafterRuntime.draft`` also takes ``slot0`` ("token" | "mask") and ``mask_id``: what fills the block
other than the design's [committed token, mask × (B-1)]. The eval never sets them; ``--diagnose`` re-drafts
with them to test a drafter against pitfalls 2 and 3 (mask-filled slot 0, another mask id).

``block`` (``draft``, ``hidden``): the block's rows, 2 .. B (default B). An engine asked for K < B - 1 drafts
plans a block of K + 1 rows, the committed token and K masks at positions a .. a+K (vLLM's DFlash proposer:
``num_query_per_req = 1 + num_speculative_tokens``; SGLang: a block of ``speculative_num_draft_tokens``), so
the bidirectional attention and DFlash2's convolutions see a shorter block; ``metrics/by_k.py`` replays that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from remote_payload.errors import PayloadError
from remote_payload.models.checkpoint import LoadedDrafter
from remote_payload.models.dflash2 import SelectorWeights, layer_convs
from remote_payload.models.selector import CandidateSelector
from remote_payload.models.spec import DrafterSpec

# Upper bound on attention-score elements (heads × queries × keys) per batched pass on CPU; SDPA's math
# path materialises the scores there. GPU kernels do not, so the bound is looser.
SCORE_BUDGET = {"cpu": 1 << 26, "cuda": 1 << 29}
HEAD_ROWS = 256  # lm_head rows per chunk (vocab 248k × 256 rows × 4 B = 250 MB)


def _qwen3_config(spec: DrafterSpec):
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                       num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                       num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.rms_norm_eps,
                       hidden_act=spec.hidden_act, attention_bias=spec.attention_bias,
                       max_position_embeddings=spec.max_position_embeddings, rope_parameters=dict(spec.rope))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [heads, L, hd]; cos/sin [L, hd]
    return x * cos + _rotate_half(x) * sin


class DraftAttention(nn.Module):
    def __init__(self, spec: DrafterSpec):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        hd, bias = spec.head_dim, spec.attention_bias
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, hd
        self.q_proj = nn.Linear(spec.hidden_size, spec.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, spec.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(hd, eps=spec.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(hd, eps=spec.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K (normed, rotated) and V for rows x [L, H] at positions given by cos/sin [L, hd]."""
        L = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(L, self.kv_heads, self.head_dim)).transpose(0, 1)
        v = self.v_proj(x).view(L, self.kv_heads, self.head_dim).transpose(0, 1)
        return _rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        """x [Q, H] block rows (flattened over blocks); ctx_k/v [kv, C, hd]; mask [Q, C + Q] bool."""
        Q = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(Q, self.heads, self.head_dim)).transpose(0, 1)
        q = _rope(q, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k = torch.cat([ctx_k, k], dim=1)
        v = torch.cat([ctx_v, v], dim=1)
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask[None, None],
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out[0].transpose(0, 1).reshape(Q, self.heads * self.head_dim))


class DraftLayer(nn.Module):
    def __init__(self, spec: DrafterSpec, config):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

        self.self_attn = DraftAttention(spec)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        convs = layer_convs(spec)  # DFlash2: a grouped dynamic convolution around each sub-layer
        if convs is not None:
            self.attention_conv, self.mlp_conv = convs

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask, block: int | None = None):
        if not hasattr(self, "attention_conv"):
            h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, mask)
            return h + self.mlp(self.post_attention_layernorm(h))
        # DFlash2: the convolved normed input feeds the sub-layer, whose output is convolved before the residual
        x, delta = self.attention_conv.prepare(self.input_layernorm(h), block)
        h = h + self.attention_conv.finish(self.self_attn(x, cos, sin, ctx_k, ctx_v, mask), delta, block)
        x, delta = self.mlp_conv.prepare(self.post_attention_layernorm(h), block)
        return h + self.mlp_conv.finish(self.mlp(x), delta, block)


class DFlashDrafter(nn.Module):
    """Parameters named as in z-lab checkpoints (layers.*, fc, hidden_norm, norm; DFlash2: the layers' convs and
    candidate_selector.*, whose codebooks have one row per token of the target's vocabulary ``vocab``)."""

    def __init__(self, spec: DrafterSpec, vocab: int | None = None):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

        config = _qwen3_config(spec)
        self.spec = spec
        self.layers = nn.ModuleList([DraftLayer(spec, config) for _ in range(spec.num_layers)])
        self.fc = nn.Linear(spec.fc_in_features, spec.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.norm = Qwen3RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        if spec.dflash2 is not None:
            if vocab is None:
                raise ValueError("a DFlash2 drafter's selector needs the target's vocabulary size")
            self.candidate_selector = SelectorWeights(spec.hidden_size, vocab, spec.dflash2.selector_rank)

    def cos_sin(self, positions: torch.Tensor, dtype):
        cos, sin = self.rotary_emb(torch.zeros(1, dtype=dtype, device=positions.device), positions[None])
        return cos[0].to(dtype), sin[0].to(dtype)


def block_mask(anchors: torch.Tensor, block_size: int, ctx_len: int, window: int | None,
               causal: bool) -> torch.Tensor:
    """Boolean [G·B, ctx_len + G·B] mask: True where a block query may attend.

    Query (g, i) sits at absolute position a_g + i. It sees context position p iff p < a_g (and, for a
    sliding layer, a_g + i - p < window), and block slot (g', j) iff g' == g, j <= i when causal, and
    |i - j| < window for a sliding layer.
    """
    G, B, dev = anchors.shape[0], block_size, anchors.device
    q_pos = (anchors[:, None] + torch.arange(B, device=dev)[None]).reshape(-1)  # [G·B]
    q_anchor = anchors.repeat_interleave(B)
    p = torch.arange(ctx_len, device=dev)
    ctx = p[None] < q_anchor[:, None]
    if window is not None:
        ctx &= (q_pos[:, None] - p[None]) < window
    slot = torch.arange(B, device=dev)
    g = torch.arange(G, device=dev).repeat_interleave(B)
    i = slot.repeat(G)
    same = g[:, None] == g[None]
    if causal:
        same &= i[None] <= i[:, None]
    if window is not None:
        same &= (i[:, None] - i[None]).abs() < window
    return torch.cat([ctx, same], dim=1)


@dataclass
class DraftContext:
    """Per-sample context: fc/hidden_norm rows and, per layer, context K/V for all positions."""
    length: int
    k: list
    v: list


class DrafterRuntime:
    """A loaded drafter bound to a target's embedding / lm_head (or its own), ready to draft."""

    def __init__(self, loaded: LoadedDrafter, target_embed: nn.Module | None, target_head: nn.Module | None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        spec = loaded.spec
        self.spec = spec
        self.block_size = spec.block_size
        self.device = torch.device(device)
        self.dtype = dtype
        codebook = loaded.weights.get("candidate_selector.predecessor_codebook")
        model = DFlashDrafter(spec, int(codebook.shape[0]) if codebook is not None else None)
        missing, unexpected = model.load_state_dict(
            {k: v.to(dtype) for k, v in loaded.weights.items()}, strict=False)
        missing = [m for m in missing if not m.startswith("rotary_emb.")]
        if missing or unexpected:  # validate_weights already checked; this guards the module definition
            raise PayloadError(f"drafter weights do not fit the module: missing {missing[:5]}, "
                               f"unexpected {unexpected[:5]}")
        inv_freq = model.rotary_emb.inv_freq.clone()
        self.model = model.to(device=self.device, dtype=dtype).eval()
        # RoPE frequencies stay fp32 (a bf16 inv_freq shifts positions noticeably at long context).
        # transformers assigns inv_freq as an nn.Buffer, so mypy types it Buffer; Module.__setattr__ stores a plain
        # tensor into the registered buffer (still non-persistent).
        self.model.rotary_emb.inv_freq = inv_freq.to(self.device)  # type: ignore[assignment]
        if spec.embed_source == "checkpoint":
            self.embed = nn.Embedding.from_pretrained(loaded.extras["embed_tokens.weight"].to(dtype), freeze=True)
            self.embed.to(self.device)
        else:
            if target_embed is None:
                raise PayloadError("drafter borrows embed_tokens from the target, but no target embedding was given")
            self.embed = target_embed
        if spec.lm_head_source == "checkpoint":
            head = nn.Linear(spec.hidden_size, loaded.extras["lm_head.weight"].shape[0], bias=False)
            head.weight = nn.Parameter(loaded.extras["lm_head.weight"].to(dtype), requires_grad=False)
            self.head = head.to(self.device)
        else:
            if target_head is None:
                raise PayloadError("drafter borrows lm_head from the target, but no target lm_head was given")
            # The target's lm_head, an nn.Linear (transformers types get_output_embeddings() as nn.Module).
            self.head = cast(nn.Linear, target_head)
        self.d2t = loaded.extras["d2t"].to(torch.int64).to(self.device) if spec.vocab_map == "d2t" else None
        self.mask_groups = self._mask_groups()
        self.selector = None
        if spec.dflash2 is not None:
            if self.d2t is not None:
                raise PayloadError("a DFlash2 drafter with a draft vocabulary (d2t) is not supported")
            sw = cast(SelectorWeights, self.model.candidate_selector)
            self.selector = CandidateSelector(sw.predecessor_codebook, sw.successor_codebook,
                                              sw.hidden_projection.weight, spec.dflash2.selector_top_k)

    def _mask_groups(self) -> dict:
        groups: dict = {}
        for idx, a in enumerate(self.spec.attn):
            groups.setdefault((a.window, a.causal), []).append(idx)
        return groups

    # -- context ---------------------------------------------------------------------------------

    def fc_input(self, features: dict) -> torch.Tensor:
        missing = [lid for lid in self.spec.fc_layer_ids if lid not in features]
        if missing:
            raise PayloadError(f"features lack target layer(s) {missing} needed by the drafter's fc")
        # Explicit cast: cached features are in the target dtype (bf16), the drafter may run in another.
        return torch.cat([features[lid].to(self.device, self.dtype) for lid in self.spec.fc_layer_ids], dim=-1)

    def prepare(self, features: dict, grad: bool = False) -> DraftContext:
        with torch.set_grad_enabled(grad):
            x = self.fc_input(features)
            c = self.model.hidden_norm(self.model.fc(x))
            pos = torch.arange(c.shape[0], device=self.device)
            cos, sin = self.model.cos_sin(pos, self.dtype)
            ks, vs = [], []
            for layer in cast("list[DraftLayer]", self.model.layers):  # an nn.ModuleList yields nn.Module
                k, v = layer.self_attn.keys_values(c, cos, sin)
                ks.append(k)
                vs.append(v)
        return DraftContext(length=c.shape[0], k=ks, v=vs)

    # -- blocks ----------------------------------------------------------------------------------

    def block_rows(self, block: int | None) -> int:
        """The rows of a block planned at ``block`` (None: the trained block size)."""
        if block is None:
            return self.block_size
        if not 2 <= block <= self.block_size:
            raise ValueError(f"a block of {block} rows: expected 2 .. {self.block_size} (the bonus row and 1 .. "
                             f"{self.block_size - 1} mask rows)")
        return int(block)

    def block_input_ids(self, tokens: torch.Tensor, anchors: torch.Tensor, slot0: str = "token",
                        mask_id: int | None = None, block: int | None = None) -> torch.Tensor:
        """[G, b] ids: slot 0 = the committed token at the anchor, slots 1.. = the mask token (b = ``block``).

        ``slot0="mask"`` fills slot 0 with the mask too and ``mask_id`` replaces the spec's mask id: both
        only for diagnostic re-drafts (the block the design prescribes is the default).
        """
        if slot0 not in ("token", "mask"):
            raise ValueError(f"slot0 must be 'token' or 'mask', not {slot0!r}")
        mask = self.spec.mask_token_id if mask_id is None else int(mask_id)
        ids = torch.full((anchors.shape[0], self.block_rows(block)), mask, dtype=torch.long, device=anchors.device)
        if slot0 == "token":
            ids[:, 0] = tokens[anchors]
        return ids

    def hidden(self, ctx: DraftContext, tokens, anchors, grad: bool = False, slot0: str = "token",
               mask_id: int | None = None, block: int | None = None) -> torch.Tensor:
        """Final-norm hidden states of slots 1..B-1 for every block: [G, B-1, H] (B = ``block`` when given)."""
        B = self.block_rows(block)
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        anchors = torch.as_tensor(anchors, dtype=torch.long, device=self.device)
        if int(anchors.max()) > ctx.length:
            raise PayloadError(f"anchor {int(anchors.max())} needs context up to it, only {ctx.length} positions given")
        with torch.set_grad_enabled(grad):
            ids = self.block_input_ids(tokens, anchors, slot0, mask_id, B)
            emb_dev = self.embed.weight.device
            h = self.embed(ids.to(emb_dev)).to(self.device, self.dtype).reshape(-1, self.spec.hidden_size)
            if self.spec.input_embedding_scale != 1.0:
                h = h * self.spec.input_embedding_scale
            pos = (anchors[:, None] + torch.arange(B, device=self.device)[None]).reshape(-1)
            cos, sin = self.model.cos_sin(pos, self.dtype)
            C = int(anchors.max())
            masks = {key: block_mask(anchors, B, C, *key) for key in self.mask_groups}
            layer_mask = {i: masks[key] for key, idxs in self.mask_groups.items() for i in idxs}
            for i, layer in enumerate(self.model.layers):
                h = layer(h, cos, sin, ctx.k[i][:, :C], ctx.v[i][:, :C], layer_mask[i], B)
            h = self.model.norm(h).view(anchors.shape[0], B, -1)
        return h[:, 1:]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (float32) for hidden rows [..., H]."""
        head_dev = self.head.weight.device
        out = self.head(h.to(head_dev, self.head.weight.dtype)).float()
        # vLLM's order (its LogitsProcessor, also the DFlash2 candidates' one): soft-cap, then the multiplier.
        if self.spec.logit_softcap:
            cap = self.spec.logit_softcap
            out = torch.tanh(out / cap) * cap
        if self.spec.output_multiplier != 1.0:
            out = out * self.spec.output_multiplier
        return out

    def _chunk_size(self, ctx_len: int, block: int) -> int:
        B, heads = block, self.spec.num_heads
        budget = SCORE_BUDGET["cuda" if self.device.type == "cuda" else "cpu"]
        g = 1
        while g < 4096 and heads * (2 * g * B) * (ctx_len + 2 * g * B) <= budget:
            g *= 2
        return g

    @torch.no_grad()
    def draft(self, ctx: DraftContext, tokens, anchors, topk: int = 1, slot0: str = "token",
              mask_id: int | None = None, block: int | None = None):
        """(ids, logprobs) [A, b-1, topk] of the blocks anchored at ``anchors``, b = ``block`` rows (module doc)."""
        anchors = torch.as_tensor(anchors, dtype=torch.long)
        rows = self.block_rows(block)
        if anchors.numel() == 0:
            shape = (0, rows - 1, topk)
            return torch.zeros(shape, dtype=torch.long), torch.zeros(shape)
        g = self._chunk_size(int(anchors.max()), rows)
        ids_out, lp_out = [], []
        for start in range(0, anchors.numel(), g):
            chunk = anchors[start:start + g]
            h = self.hidden(ctx, tokens, chunk, slot0=slot0, mask_id=mask_id, block=rows)
            if self.selector is not None:  # DFlash2: the selector's walk from the block's anchor token
                anchor_tokens = torch.as_tensor(tokens, dtype=torch.long)[chunk].to(self.device)
                ids, lps, _ = self.selector.walk_candidates(*self.candidates(h), h, anchor_tokens, topk)
                ids_out.append(_pad_ranks(ids.cpu(), topk, -1).reshape(-1, topk))
                lp_out.append(_pad_ranks(lps.cpu(), topk, float("-inf")).reshape(-1, topk))
                continue
            h = h.reshape(-1, self.spec.hidden_size)
            for r in range(0, h.shape[0], HEAD_ROWS):
                lp = torch.log_softmax(self.logits(h[r:r + HEAD_ROWS]), dim=-1)
                vals, idx = lp.topk(topk, dim=-1)
                if self.d2t is not None:
                    idx = idx + self.d2t.to(idx.device)[idx]
                ids_out.append(idx.cpu())
                lp_out.append(vals.cpu())
        B1 = rows - 1
        return torch.cat(ids_out).view(-1, B1, topk), torch.cat(lp_out).view(-1, B1, topk)

    def candidates(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DFlash2: each slot's top-K logits (multiplied and soft-capped) and ids, h [..., H] -> [..., K] each,
        a chunk of rows at a time (a [rows, V] logits tensor exists for one chunk only)."""
        assert self.selector is not None
        rows = h.reshape(-1, h.shape[-1])
        vals, ids = [], []
        for r in range(0, rows.shape[0], HEAD_ROWS):
            v, i = self.selector.candidates(self.logits(rows[r:r + HEAD_ROWS]))
            vals.append(v)
            ids.append(i)
        k = vals[0].shape[-1] if vals else 0
        return torch.cat(vals).view(*h.shape[:-1], k), torch.cat(ids).view(*h.shape[:-1], k)

    @property
    def vocab_size(self) -> int:
        """The target vocabulary's size (the embedding table the block is embedded with)."""
        return int(self.embed.weight.shape[0])

    @torch.no_grad()
    def slot_logprobs(self, ctx: DraftContext, tokens, anchors, sampling) -> torch.Tensor:
        """log q_{a,j}(v) [len(anchors), B-1, V] (module doc): the block logits at anchor a (they depend on
        tokens[:a+1] and the context before a only) processed like the target's law at ``sampling``."""
        from remote_payload.inputs.sampling import processed

        anchors = torch.as_tensor(anchors, dtype=torch.long)
        B1, V = self.block_size - 1, self.vocab_size
        if anchors.numel() == 0:
            return torch.zeros((0, B1, V), device=self.device)
        if self.selector is not None:
            return self._selector_logprobs(ctx, tokens, anchors, sampling)
        h = self.hidden(ctx, tokens, anchors).reshape(-1, self.spec.hidden_size)
        logits = self.logits(h)
        if self.d2t is not None:  # a draft vocabulary: its ids placed in the target's, every other id impossible
            full = torch.full((logits.shape[0], V), float("-inf"), device=logits.device)
            ids = torch.arange(logits.shape[1], device=logits.device)
            logits = full.index_copy(1, ids + self.d2t.to(logits.device), logits)
        return processed(logits, sampling).log().view(-1, B1, V)

    def _selector_logprobs(self, ctx: DraftContext, tokens, anchors: torch.Tensor, sampling) -> torch.Tensor:
        """DFlash2's q_{a,j}: the selector's law at slot j when the drafts before it were tokens[a+1..a+j-1]
        (predecessor tokens[a+j-1]); softmax(scores / T) over the K candidates, no top-k/top-p there."""
        h = self.hidden(ctx, tokens, anchors)  # [A, B-1, H]
        toks = torch.as_tensor(tokens, dtype=torch.long)
        pred_pos = (anchors[:, None] + torch.arange(self.block_size - 1)[None]).clamp(max=len(toks) - 1)
        # slots past the end of tokens: their predecessor is a stand-in (no round reaches them)
        cand = self.candidates(h)
        assert self.selector is not None
        return self.selector.slot_logprobs_candidates(*cand, h, toks[pred_pos].to(self.device),
                                                      float(sampling.temperature), self.vocab_size)

    @torch.no_grad()
    def draw_block(self, ctx: DraftContext, tokens, anchor: int, sampling, gen) -> tuple[list[int], torch.Tensor]:
        """The online sampled-rule block at ``anchor``: each slot's draft drawn from its own law (module doc);
        DFlash2's selector draws slot by slot, each law given the draft drawn before it."""
        if self.selector is None:
            q = self.slot_logprobs(ctx, tokens, [anchor], sampling)[0].exp().to("cpu", torch.float32)
            return torch.multinomial(q, 1, generator=gen)[:, 0].tolist(), q
        h = self.hidden(ctx, tokens, [anchor])  # [1, B-1, H]
        cand_logits, cand_ids = self.candidates(h)
        prev, drafts, laws = int(tokens[anchor]), [], []
        for j in range(self.block_size - 1):
            lq = self.selector.slot_logprobs_candidates(
                cand_logits[:, j:j + 1], cand_ids[:, j:j + 1], h[:, j:j + 1],
                torch.tensor([[prev]], device=self.device), float(sampling.temperature), self.vocab_size)
            q = lq[0, 0].exp().to("cpu", torch.float32)
            prev = int(torch.multinomial(q, 1, generator=gen))
            drafts.append(prev)
            laws.append(q)
        return drafts, torch.stack(laws)


def _pad_ranks(x: torch.Tensor, topk: int, fill) -> torch.Tensor:
    """[..., k] -> [..., topk]: a DFlash2 slot ranks only its K candidates; ranks past K hold ``fill``."""
    if x.shape[-1] >= topk:
        return x
    return torch.cat([x, torch.full((*x.shape[:-1], topk - x.shape[-1]), fill, dtype=x.dtype)], dim=-1)
