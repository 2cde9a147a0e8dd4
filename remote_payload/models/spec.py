"""The one internal drafter spec every checkpoint format is normalised to.

Formats (see README "Drafter formats"):
- ``zlab``: config.json with ``dflash_config`` (old schema: ``block_size`` at top level, rope in
  ``rope_theta``/``rope_scaling``; new schema: ``block_size`` inside ``dflash_config``, ``rope_parameters``,
  per-layer ``layer_types`` + ``sliding_window``, optional ``is_causal``). Target layer ids are decoder-layer
  indices. embed_tokens / lm_head come from the target.
- ``speculators``: ``transformer_layer_config`` + ``aux_hidden_state_layer_ids`` (already shifted by +1:
  id i is HF hidden_states[i], i.e. decoder layer i-1), embed_tokens / lm_head copies and optional ``d2t``.
- ``training``: the team's torch checkpoint; spec from a sidecar (z-lab-style keys) where the last listed
  target layer is reserved for the training loss unless ``reserve_last_target_layer: false``.

Everything downstream (feature selection, masks, rope, validation, results) reads only this spec, so
the layer-offset and causality conventions are resolved exactly once, here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from remote_payload.errors import PayloadError

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass(frozen=True)
class AttnLayer:
    kind: str  # FULL | SLIDING
    window: int | None  # attention window in tokens (sliding layers), None = unlimited
    causal: bool  # causal inside the draft block


@dataclass(frozen=True)
class Dflash2Fields:
    """What a DFlash2 drafter adds (``dflash_config``): the grouped dynamic convolutions around each sub-layer
    (``conv_kernel_size`` taps, ``conv_group_size`` channels sharing one dynamic coefficient) and the candidate
    selector (``selector_rank``, the walk over the top ``selector_top_k`` candidates of each slot)."""
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    vocab_rows: int | None = None  # the selector codebooks' rows in the checkpoint (must be the target's vocabulary)


DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass
class DrafterSpec:
    format: str
    block_size: int
    mask_token_id: int
    fc_layer_ids: list[int]  # target decoder-layer ids concatenated (in this order) into fc
    reserved_layer_ids: list[int]  # target layers that only fed the training loss (not fc)
    layer_ids_source: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str
    attention_bias: bool
    attn: list[AttnLayer]
    causality_source: str
    rope: dict
    max_position_embeddings: int
    embed_source: str = "target"  # "target" | "checkpoint"
    lm_head_source: str = "target"
    draft_vocab_size: int | None = None  # None: the target's vocabulary
    vocab_map: str | None = None  # "d2t": draft id -> target id = id + d2t[id]
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    logit_softcap: float | None = None
    weights_dtype: str | None = None
    notes: list[str] = field(default_factory=list)
    dflash2: Dflash2Fields | None = None  # None: a DFlash drafter

    @property
    def variant(self) -> str:
        return "dflash2" if self.dflash2 else "dflash"

    @property
    def fc_in_features(self) -> int:
        return len(self.fc_layer_ids) * self.hidden_size

    @property
    def uses_reserved_layer(self) -> bool:
        return bool(self.reserved_layer_ids)

    def to_json(self) -> dict:
        d = asdict(self)
        d["attn"] = [asdict(a) for a in self.attn]
        d["variant"] = self.variant
        d["fc_in_features"] = self.fc_in_features
        d["layer_convention"] = "decoder-layer index: layer l = output of decoder layer l (HF hidden_states[l+1])"
        d["fc_layers_kind"] = ("k-1 layers to fc, last target layer reserved for the training loss"
                               if self.reserved_layer_ids else "all listed target layers feed fc")
        return d


# ---------------------------------------------------------------------------------------------------
# helpers


def zlab_default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default spread of target layers when a config lists none (e.g. 64, 5 -> 1,16,31,46,61)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def _int(cfg: dict, key: str, where: str, *fallback_keys: str, required: bool = True):
    for k in (key, *fallback_keys):
        if k in cfg and cfg[k] is not None:
            value = cfg[k]
            if isinstance(value, bool) or not isinstance(value, int):
                raise PayloadError(f"{where}: {k} must be an integer, found {value!r}")
            return value
    if required:
        raise PayloadError(f"{where}: missing field {key}")
    return None


def _int_list(value, key: str, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value):
        raise PayloadError(f"{where}: {key} must be a non-empty list of integers, found {value!r}")
    if len(set(value)) != len(value):
        raise PayloadError(f"{where}: {key} lists a layer twice: {value}")
    return list(value)


def _rope(cfg: dict, where: str) -> dict:
    """Normalise old (rope_theta + rope_scaling) and new (rope_parameters) schemas to one dict."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        rope = dict(params)
        if "rope_theta" not in rope and "rope_theta" in cfg:
            rope["rope_theta"] = cfg["rope_theta"]
    elif "rope_theta" in cfg:
        scaling = dict(cfg.get("rope_scaling") or {})
        if "type" in scaling and "rope_type" not in scaling:
            scaling["rope_type"] = scaling.pop("type")
        rope = {"rope_type": "default", **scaling, "rope_theta": cfg["rope_theta"]}
    else:
        raise PayloadError(f"{where}: no rope settings (rope_parameters or rope_theta); the drafter's RoPE must "
                           "match its training, refusing to guess")
    rope.setdefault("rope_type", "default")
    if not isinstance(rope.get("rope_theta"), (int, float)):
        raise PayloadError(f"{where}: rope_theta must be a number, found {rope.get('rope_theta')!r}")
    return rope


def _layer_types(cfg: dict, num_layers: int, where: str) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        # Qwen3 semantics: layer i slides iff use_sliding_window and i >= max_window_layers.
        if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
            mwl = int(cfg.get("max_window_layers", num_layers))
            types = [SLIDING if i >= mwl else FULL for i in range(num_layers)]
        else:
            types = [FULL] * num_layers
    if not isinstance(types, list) or len(types) != num_layers:
        raise PayloadError(f"{where}: layer_types lists {len(types) if isinstance(types, list) else types!r} "
                           f"entries but the drafter has {num_layers} layers")
    unknown = sorted({t for t in types if t not in (FULL, SLIDING)})
    if unknown:
        raise PayloadError(f"{where}: unsupported layer type(s) {unknown} (expected {FULL} / {SLIDING})")
    return types


def _attn(types: list[str], window, causal_rule, where: str) -> list[AttnLayer]:
    if SLIDING in types and not isinstance(window, int):
        raise PayloadError(f"{where}: sliding_attention layers need an integer sliding_window, found {window!r}")
    return [AttnLayer(t, window if t == SLIDING else None, causal_rule(t)) for t in types]


def _arch(cfg: dict, shapes: dict, where: str) -> dict:
    """Architecture fields from the config, falling back to what the weight shapes determine."""
    def shape(name):
        return shapes.get(name)

    hidden = cfg.get("hidden_size") or (shape("fc.weight") or [None])[0]
    layers = cfg.get("num_hidden_layers")
    if layers is None:
        idx = {int(k.split(".")[1]) for k in shapes if k.startswith("layers.") and k.split(".")[1].isdigit()}
        layers = max(idx) + 1 if idx else None
    head_dim = cfg.get("head_dim") or (shape("layers.0.self_attn.q_norm.weight") or [None])[0]
    heads = cfg.get("num_attention_heads")
    if heads is None and head_dim and shape("layers.0.self_attn.q_proj.weight"):
        heads = shape("layers.0.self_attn.q_proj.weight")[0] // head_dim
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    kv = cfg.get("num_key_value_heads")
    if kv is None and head_dim and shape("layers.0.self_attn.k_proj.weight"):
        kv = shape("layers.0.self_attn.k_proj.weight")[0] // head_dim
    inter = cfg.get("intermediate_size") or (shape("layers.0.mlp.gate_proj.weight") or [None])[0]
    arch = {"hidden_size": hidden, "num_hidden_layers": layers, "head_dim": head_dim, "num_attention_heads": heads,
            "num_key_value_heads": kv if kv is not None else heads, "intermediate_size": inter}
    missing = [k for k, v in arch.items() if v is None]
    if missing:
        raise PayloadError(f"{where}: missing field(s) {', '.join(missing)} (not in the config and not derivable "
                           "from the weights)")
    arch.update(rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), hidden_act=str(cfg.get("hidden_act", "silu")),
                attention_bias=bool(cfg.get("attention_bias", False)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)))
    if arch["hidden_act"] != "silu":
        raise PayloadError(f"{where}: hidden_act {arch['hidden_act']!r} unsupported (Qwen3-style drafters use silu)")
    return arch


def _common(fmt: str, arch: dict, **kw) -> DrafterSpec:
    return DrafterSpec(format=fmt, hidden_size=int(arch["hidden_size"]), num_layers=int(arch["num_hidden_layers"]),
                       num_heads=int(arch["num_attention_heads"]), num_kv_heads=int(arch["num_key_value_heads"]),
                       head_dim=int(arch["head_dim"]), intermediate_size=int(arch["intermediate_size"]),
                       rms_norm_eps=arch["rms_norm_eps"], hidden_act=arch["hidden_act"],
                       attention_bias=arch["attention_bias"],
                       max_position_embeddings=arch["max_position_embeddings"], **kw)


# The largest block a drafter may declare: DFlash drafters use 8-16; every per-position list (rates, histograms,
# per-K figures) is this long, so a bound here bounds them, and the controller reads results with the same bound.
MAX_BLOCK_SIZE = 256


def _check_block(block_size: int, where: str) -> None:
    if block_size < 2:
        raise PayloadError(f"{where}: block_size must be >= 2 (slot 0 holds the committed token), found {block_size}")
    if block_size > MAX_BLOCK_SIZE:
        raise PayloadError(f"{where}: block_size {block_size} is more than {MAX_BLOCK_SIZE}, the largest dfo evaluates")


def declares_dflash2(cfg: dict) -> bool:
    """A config is DFlash2's when its architectures say so or its dflash_config carries a DFlash2 field."""
    archs = cfg.get("architectures") or []
    dcfg = cfg.get("dflash_config")
    dcfg = dcfg if isinstance(dcfg, dict) else {}
    return any("DFlash2" in str(a) for a in archs) or any(k in dcfg for k in DFLASH2_FIELDS)


def _dflash2(cfg: dict, dcfg: dict, arch: dict, block: int, shapes: dict, where: str) -> Dflash2Fields | None:
    if not declares_dflash2(cfg):
        return None
    missing = [f"dflash_config.{k}" for k in DFLASH2_FIELDS if k not in dcfg]
    if missing:
        raise PayloadError(f"{where}: a DFlash2 config (architectures {cfg.get('architectures')}) needs "
                           f"{', '.join(missing)}; z-lab's DFlash2 configs carry all four")
    rows = (shapes.get("candidate_selector.predecessor_codebook") or [None])[0]
    fields = Dflash2Fields(**{k: _int(dcfg, k, f"{where} dflash_config") for k in DFLASH2_FIELDS},
                           vocab_rows=int(rows) if rows is not None else None)
    hidden = int(arch["hidden_size"])
    if not 1 <= fields.conv_kernel_size <= block:
        raise PayloadError(f"{where}: dflash_config.conv_kernel_size {fields.conv_kernel_size} must be between 1 "
                           f"and the block size {block}")
    if fields.conv_group_size < 1 or hidden % fields.conv_group_size:
        raise PayloadError(f"{where}: dflash_config.conv_group_size {fields.conv_group_size} must divide the hidden "
                           f"size {hidden}")
    if fields.selector_rank < 1 or fields.selector_top_k < 1:
        raise PayloadError(f"{where}: dflash_config.selector_rank and selector_top_k must be >= 1, found "
                           f"{fields.selector_rank} and {fields.selector_top_k}")
    return fields


# ---------------------------------------------------------------------------------------------------
# formats


def from_zlab(cfg: dict, shapes: dict, where: str, fmt: str = "zlab") -> DrafterSpec:
    dcfg = cfg.get("dflash_config") or {}
    if not isinstance(dcfg, dict):
        raise PayloadError(f"{where}: dflash_config must be an object")
    arch = _arch(cfg, shapes, where)
    block = _int(dcfg, "block_size", where, required=False)
    if block is None:
        block = _int(cfg, "block_size", where, required=False)
    if block is None:
        raise PayloadError(f"{where}: missing field block_size (dflash_config.block_size or top-level block_size)")
    _check_block(block, where)
    mask = _int(dcfg, "mask_token_id", where, required=False)
    if mask is None:
        mask = _int(cfg, "mask_token_id", where, required=False)
    if mask is None:
        raise PayloadError(f"{where}: missing field dflash_config.mask_token_id; refusing to fall back to pad/eos "
                           "(pitfall 3). Give it with --drafter-spec NAME=FILE containing {\"mask_token_id\": N}")
    if "target_layer_ids" in dcfg:
        ids = _int_list(dcfg["target_layer_ids"], "dflash_config.target_layer_ids", where)
        source = "dflash_config.target_layer_ids (decoder-layer ids)"
    elif "num_target_layers" in cfg:
        ids = zlab_default_layer_ids(int(cfg["num_target_layers"]), int(arch["num_hidden_layers"]))
        source = "z-lab default spread over num_target_layers (config lists no target_layer_ids)"
    else:
        raise PayloadError(f"{where}: missing field dflash_config.target_layer_ids")
    reserved = dcfg.get("reserved_target_layer_ids") or []
    if reserved:
        reserved = _int_list(reserved, "dflash_config.reserved_target_layer_ids", where)
    types = _layer_types(cfg, arch["num_hidden_layers"], where)
    is_causal = cfg.get("is_causal")
    if is_causal is None:
        attn = _attn(types, cfg.get("sliding_window"), lambda t: t == SLIDING, where)
        causality = "z-lab default: sliding-window layers causal inside the block, full layers bidirectional"
    else:
        attn = _attn(types, cfg.get("sliding_window"), lambda t: bool(is_causal), where)
        causality = f"config is_causal={bool(is_causal)} for every layer"
    return _common(fmt, arch, block_size=block, mask_token_id=mask, fc_layer_ids=ids, reserved_layer_ids=reserved,
                   layer_ids_source=source, attn=attn, causality_source=causality, rope=_rope(cfg, where),
                   dflash2=_dflash2(cfg, dcfg, arch, block, shapes, where),
                   input_embedding_scale=float(dcfg.get("input_embedding_scale", 1.0)),
                   output_multiplier=float(dcfg.get("output_multiplier", 1.0)),
                   logit_softcap=(float(dcfg["final_logit_softcapping"])
                                  if dcfg.get("final_logit_softcapping") else None))


def from_speculators(cfg: dict, shapes: dict, where: str) -> DrafterSpec:
    tl = cfg.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise PayloadError(f"{where}: missing field transformer_layer_config")
    if cfg.get("projector_type", "dflash") != "dflash":
        raise PayloadError(f"{where}: projector_type {cfg.get('projector_type')!r} unsupported (only 'dflash')")
    if declares_dflash2(cfg):
        raise PayloadError(f"{where}: a DFlash2 drafter in the speculators format is not supported (its selector "
                           "scores the target's whole vocabulary, which a draft vocabulary cannot hold); give it in "
                           "the z-lab format (config.json with architectures [\"DFlash2DraftModel\"])")
    if cfg.get("sample_from_anchor"):
        raise PayloadError(f"{where}: sample_from_anchor drafters (DSpark) are not DFlash drafters; unsupported")
    arch = _arch(tl, shapes, f"{where} transformer_layer_config")
    block = _int(cfg, "block_size", where)
    _check_block(block, where)
    mask = _int(cfg, "mask_token_id", where, required=False)
    if mask is None:
        raise PayloadError(f"{where}: missing field mask_token_id; refusing to fall back to pad/eos (pitfall 3)")
    aux = _int_list(cfg.get("aux_hidden_state_layer_ids"), "aux_hidden_state_layer_ids", where)
    if min(aux) < 1:
        raise PayloadError(f"{where}: aux_hidden_state_layer_ids {aux} include 0 (the embedding output); "
                           "only decoder-layer outputs are supported")
    types = _layer_types(tl, arch["num_hidden_layers"], where)
    non_causal = bool(cfg.get("sliding_window_non_causal", False))
    attn = _attn(types, tl.get("sliding_window"), lambda t: t == SLIDING and not non_causal, where)
    has_head = "lm_head.weight" in shapes
    draft_vocab = int(cfg.get("draft_vocab_size") or (shapes["lm_head.weight"][0] if has_head else 0)) or None
    return _common("speculators", arch, block_size=block, mask_token_id=mask, fc_layer_ids=[i - 1 for i in aux],
                   reserved_layer_ids=[], layer_ids_source="aux_hidden_state_layer_ids minus 1 (speculators ids "
                   "index HF hidden_states, already shifted by +1)", attn=attn,
                   causality_source=("speculators: full layers bidirectional, sliding layers "
                                     + ("bidirectional (sliding_window_non_causal)" if non_causal else "causal")),
                   rope=_rope(tl, f"{where} transformer_layer_config"),
                   embed_source="checkpoint" if "embed_tokens.weight" in shapes else "target",
                   lm_head_source="checkpoint" if has_head else "target",
                   draft_vocab_size=draft_vocab if has_head else None,
                   vocab_map="d2t" if "d2t" in shapes else None)


TRAINING_REQUIRED = ("block_size", "mask_token_id", "target_layer_ids")


def from_training(spec: dict, shapes: dict, where: str) -> DrafterSpec:
    """The team's training checkpoint: z-lab-style keys, flat or under dflash_config, plus
    ``reserve_last_target_layer`` (default true: fc gets all but the last listed target layer)."""
    if not isinstance(spec, dict):
        raise PayloadError(f"{where}: the drafter spec must be a mapping")
    flat = dict(spec)
    dcfg = dict(flat.pop("dflash_config", None) or {})
    for key in ("block_size", "mask_token_id", "target_layer_ids", *DFLASH2_FIELDS, "output_multiplier",
                "final_logit_softcapping", "input_embedding_scale"):
        if key in flat and key not in dcfg:
            dcfg[key] = flat.pop(key)
    missing = [k for k in TRAINING_REQUIRED if k not in dcfg]
    if "rope_parameters" not in flat and "rope_theta" not in flat:
        missing.append("rope_theta (or rope_parameters)")
    if missing:
        raise PayloadError(f"{where}: the training drafter spec lacks {', '.join(missing)}")
    reserve = flat.pop("reserve_last_target_layer", dcfg.pop("reserve_last_target_layer", True))
    ids = _int_list(dcfg["target_layer_ids"], "target_layer_ids", where)
    if reserve:
        if len(ids) < 2:
            raise PayloadError(f"{where}: reserve_last_target_layer needs at least 2 target_layer_ids, found {ids}")
        dcfg["target_layer_ids"], dcfg["reserved_target_layer_ids"] = ids[:-1], ids[-1:]
    flat["dflash_config"] = dcfg
    out = from_zlab(flat, shapes, where, fmt="training")
    out.layer_ids_source = ("training spec target_layer_ids; last one reserved for the training loss"
                            if reserve else "training spec target_layer_ids (all feed fc)")
    return out
