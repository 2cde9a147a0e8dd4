"""`dfo lint`'s rules: a drafter's facts (its configs and safetensors headers) and its target's, in; findings out.
Pure: no I/O. Each finding has a stable code (``CODES``), a severity, the field it is about and what to do.

The failures these rules look for raise no error anywhere: a drafter that loads, runs and accepts little. Where a
rule rests on a public case, the case is named (docs/lint.md lists every code)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, TypeGuard

from orchestrator.lint.codes import (  # noqa: F401 (re-exported: the rules' vocabulary)
    CHAT_TOKENS,
    CODES,
    CONFIRMED_BY_DIAGNOSE,
    DFLASH2_KEY_PARTS,
    ENGINE_CONVENTIONS,
    ERROR,
    INFO,
    QUANTIZED_DTYPES,
    QUANTIZED_NAME_PARTS,
    WARNING,
    confirmed_by_diagnose,
)
from orchestrator.lint.replies import DrafterFacts, TargetFacts, Tensor
from remote_payload.errors import PayloadError
from remote_payload.models.spec import (
    DFLASH2_FIELDS,
    FULL,
    SLIDING,
    declares_dflash2,
    from_speculators,
    from_training,
    from_zlab,
    zlab_default_layer_ids,
)


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    field: str
    message: str
    action: str

    def to_json(self) -> dict:
        return asdict(self)


def finding(code: str, field: str, message: str, action: str | None = None) -> Finding:
    severity, _meaning, default_action = CODES[code]
    return Finding(code, severity, field, message, action or default_action)


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == ERROR]


def _int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


# ------------------------------------------------------------------------------------------- the drafter's view


@dataclass
class View:
    """What the config says, in the words of its own format, before dfo's reader normalises it."""
    fmt: str                 # zlab | speculators | training | training (stripped)
    cfg: dict                # the config (or training spec) as read
    layer_cfg: dict          # where the layer fields live (speculators: transformer_layer_config)
    dcfg: dict               # dflash_config (z-lab), or the training spec's flat keys
    where: str               # the file the fields are in
    ids_field: str
    raw_ids: Any             # as written
    hidden_states_index: bool  # the ids index HF hidden_states (speculators), not decoder layers
    reserve_last: bool = False  # training specs: the last id feeds only the training loss


def _view(d: DrafterFacts, out: list[Finding]) -> View | None:
    if d.kind == "torch":
        return _torch_view(d, out)
    cfg_doc = d.json.get("config.json")
    if cfg_doc is None:
        out.append(finding("config-missing", "config.json", f"{d.where}: no config.json beside the weights"))
        return None
    if cfg_doc.error or not isinstance(cfg_doc.data, dict):
        why = cfg_doc.error or "not an object"
        out.append(finding("config-invalid", "config.json", f"{d.where}/config.json: {why}"))
        return None
    cfg = cfg_doc.data
    where = f"{d.where}/config.json" if d.kind == "folder" else "config.json"
    if _dict(d.doc("dfo-source.json")).get("format") == "training":
        dcfg = _dict(cfg.get("dflash_config"))
        return View("training (stripped)", cfg, cfg, dcfg, where, "dflash_config.target_layer_ids",
                    dcfg.get("target_layer_ids"), False)
    if any(k in cfg for k in ("speculators_model_type", "transformer_layer_config", "speculators_config")):
        return View("speculators", cfg, _dict(cfg.get("transformer_layer_config")), cfg, where,
                    "aux_hidden_state_layer_ids", cfg.get("aux_hidden_state_layer_ids"), True)
    if "dflash_config" in cfg or "block_size" in cfg:
        dcfg = _dict(cfg.get("dflash_config"))
        return View("zlab", cfg, cfg, dcfg, where, "dflash_config.target_layer_ids", dcfg.get("target_layer_ids"),
                    False)
    out.append(finding("config-unrecognised", "config.json", f"{where}: keys {', '.join(sorted(cfg)[:12])}"))
    return None


def _torch_view(d: DrafterFacts, out: list[Finding]) -> View | None:
    if not d.torch_zip:
        out.append(finding("torch-not-zip", d.where, f"{d.where}: {d.torch_size or 0} bytes, not a torch.save zip "
                           "file (empty, truncated or another format)"))
        return None
    name, doc = next(((n, doc) for n, doc in d.json.items()), (None, None))
    if doc is None or name is None:
        out.append(finding("torch-no-spec", d.where, f"{d.where}: no spec.json beside it; its embedded 'config' "
                           "(if any) is read only when the eval loads it"))
        return None
    out.append(finding("torch-not-read", d.where, f"its tensors are not read here; the spec {name} beside it is "
                       "linted"))
    if doc.error or not isinstance(doc.data, dict):
        out.append(finding("config-invalid", name, f"{name} beside {d.where}: {doc.error or 'not an object'}"))
        return None
    spec = dict(doc.data)
    dcfg = {**{k: v for k, v in spec.items() if k != "dflash_config"}, **_dict(spec.get("dflash_config"))}
    reserve = spec.get("reserve_last_target_layer", _dict(spec.get("dflash_config")).get("reserve_last_target_layer",
                                                                                          True))
    return View("training", spec, spec, dcfg, name, "target_layer_ids", dcfg.get("target_layer_ids"), False,
                reserve_last=bool(reserve))


# ------------------------------------------------------------------------------------------- the target's facts


@dataclass
class Target:
    hidden: int | None
    layers: int | None
    vocab: int | None
    quant: str | None
    facts: TargetFacts


def _target(t: TargetFacts | None, out: list[Finding]) -> Target | None:
    if t is None:
        return None
    if t.config is None or t.config.error or not isinstance(t.config.data, dict):
        why = "no config.json" if t.config is None else t.config.error or "config.json is not an object"
        out.append(finding("target-unreadable", "config.json", f"target {t.where}: {why}"))
        return None
    cfg = t.config.data
    text = _dict(cfg.get("text_config")) or cfg  # a VL wrapper keeps the language model's fields there
    pick = lambda key: text.get(key) if _int(text.get(key)) else cfg.get(key) if _int(cfg.get(key)) else None  # noqa: E731
    if t.tokenizer.error:
        out.append(finding("target-unreadable", "tokenizer.json", f"target {t.where}/tokenizer.json: "
                           f"{t.tokenizer.error}"))
    return Target(pick("hidden_size"), pick("num_hidden_layers"), pick("vocab_size"), quant_scheme(cfg), t)


def quant_scheme(cfg: dict) -> str | None:
    """A config's quantization as one label (``modelopt NVFP4``, ``mxfp4``, ``compressed-tensors 4-bit``), None
    for an unquantized one."""
    q = _dict(cfg.get("quantization_config"))
    if not q:
        return None
    parts = [str(q.get("quant_method") or "quantized")]
    for key in ("quant_algo", "format", "fmt"):
        if isinstance(q.get(key), str):
            parts.append(q[key])
    groups = _dict(q.get("config_groups"))
    bits = {_dict(_dict(g).get("weights")).get("num_bits") for g in groups.values()} - {None}
    if q.get("bits") is not None:
        bits.add(q["bits"])
    parts += [f"{b}-bit" for b in sorted(map(str, bits))]
    return " ".join(parts)


# ------------------------------------------------------------------------------------------- the rules


def lint(d: DrafterFacts, t: TargetFacts | None = None, *, enable_thinking: bool | None = None,
         engine_ks: Iterable[int] = ()) -> list[Finding]:
    """Every finding about drafter D (against target T when given). ENABLE_THINKING: the thinking mode an eval
    will render prompts in; ENGINE_KS: the draft counts an engine will be asked for (an eval's --engine-k)."""
    out: list[Finding] = []
    _files(d, out)
    view = _view(d, out)
    target = _target(t, out)
    if t is None:
        out.append(finding("no-target", "--target", "checked the drafter alone"))
    if view is None:
        return out
    shapes = {n: list(x.shape) for n, x in d.tensors().items()}
    ids = _layer_ids(view, target, out)
    hidden = _fc(view, d, ids, target, out)
    _block(view, out, engine_ks)
    _mask(view, target, out)
    _windows(view, out)
    _dflash2(view, d, target, out)
    _dtypes(view, d, target, out)
    _embeddings(d, target, hidden, out)
    _training(view, target, enable_thinking, out)
    if not errors(out):
        _spec_reader(view, shapes, out)
    return out


def _files(d: DrafterFacts, out: list[Finding]) -> None:
    for f in d.files:
        if f.error:
            out.append(finding("safetensors-unreadable", f.name, f"{d.where}: {f.name}: {f.error}"))
    if d.kind != "torch" and not d.files:
        hint = f" (a training checkpoint beside it: lint {d.torch_files[0]} itself)" if d.torch_files else ""
        out.append(finding("no-weights", d.where, f"{d.where}: no *.safetensors file{hint}"))


def _layer_ids(v: View, target: Target | None, out: list[Finding]) -> list[int] | None:
    """The fc layer ids as decoder-layer indices (None when the config has none usable)."""
    n = target.layers if target else v.cfg.get("num_target_layers") if _int(v.cfg.get("num_target_layers")) else None
    raw = v.raw_ids
    if raw is None:
        if _int(v.cfg.get("num_target_layers")) and v.fmt == "zlab":
            draft_layers = v.cfg.get("num_hidden_layers")
            guess = zlab_default_layer_ids(v.cfg["num_target_layers"], draft_layers) if _int(draft_layers) else None
            out.append(finding("layer-ids-guessed", v.ids_field, f"{v.where}: no {v.ids_field}; z-lab's fallback "
                               f"would use {guess} over num_target_layers {v.cfg['num_target_layers']}"))
            return guess
        out.append(finding("layer-ids-missing", v.ids_field, f"{v.where}: no {v.ids_field}"))
        return None
    if not isinstance(raw, list) or not raw or not all(_int(i) for i in raw):
        out.append(finding("layer-ids-invalid", v.ids_field, f"{v.where}: {v.ids_field} is {str(raw)[:120]}"))
        return None
    decoder = [i - 1 for i in raw] if v.hidden_states_index else list(raw)
    fc_ids = decoder[:-1] if v.reserve_last and len(decoder) > 1 else decoder
    reserved = decoder[-1:] if v.reserve_last and len(decoder) > 1 else []
    conv = ("HF hidden_states indices (decoder layer + 1)" if v.hidden_states_index
            else "decoder-layer ids (layer l = output of decoder layer l = HF hidden_states[l+1])")
    out.append(finding("layer-convention", v.ids_field, f"{v.fmt} format: {v.ids_field} {raw} read as {conv}; fc "
                       f"over decoder layers {fc_ids}" + (f", {reserved} reserved for the training loss"
                                                          if reserved else "")
                       + "; z-lab, vLLM, SGLang and SpecForge read decoder-layer ids, speculators and "
                       "onnxruntime-genai hidden_states indices (+1)"))
    dupes = sorted({i for i in raw if raw.count(i) > 1})
    if dupes:
        out.append(finding("layer-ids-duplicate", v.ids_field, f"{v.where}: {v.ids_field} {raw} lists {dupes} more "
                           f"than once: {len(raw)} ids but {len(set(raw))} distinct layers"))
    negative = [r for r, i in zip(raw, decoder, strict=True) if i < 0]
    if negative:
        what = "0 is the embedding output, not a decoder layer" if v.hidden_states_index else "ids count from 0"
        out.append(finding("layer-ids-negative", v.ids_field, f"{v.where}: {v.ids_field} {raw} holds {negative} "
                           f"({what})"))
    if n is not None:
        beyond = [r for r, i in zip(raw, decoder, strict=True) if i >= n]
        if beyond:
            most = n if v.hidden_states_index else n - 1
            out.append(finding("layer-ids-out-of-range", v.ids_field, f"{v.where}: {v.ids_field} {raw} holds "
                               f"{beyond}, past the target's {n} decoder layers (at most {most} in this "
                               "convention)"))
        elif n - 1 in fc_ids:
            out.append(finding("layer-ids-last-layer", v.ids_field, f"{v.where}: fc reads decoder layer {n - 1}, "
                               f"the last of the target's {n}"))
        everything = decoder
        default = zlab_default_layer_ids(n, len(everything)) if len(everything) >= 2 else None
        if default and everything != default and everything in ([i + 1 for i in default], [i - 1 for i in default]):
            sign = "plus" if everything[0] == default[0] + 1 else "minus"
            out.append(finding("layer-ids-shifted", v.ids_field, f"{v.where}: decoder layers {everything} are z-lab's "
                               f"default spread {default} over {n} layers {sign} one"))
    aux = v.cfg.get("aux_hidden_state_layer_ids") if not v.hidden_states_index else None
    if isinstance(aux, list) and aux != [i + 1 for i in decoder]:
        out.append(finding("layer-ids-two-conventions", "aux_hidden_state_layer_ids", f"{v.where}: {v.ids_field} "
                           f"{raw} (decoder layers) but aux_hidden_state_layer_ids {aux[:16]} (hidden_states "
                           f"indices: {[i + 1 for i in decoder]} expected)"))
    return fc_ids if not dupes and not negative else None


def _fc(v: View, d: DrafterFacts, fc_ids: list[int] | None, target: Target | None,
        out: list[Finding]) -> int | None:
    """fc's width against the layer ids and the target's hidden size; returns the drafter's hidden size."""
    hidden_cfg = v.layer_cfg.get("hidden_size")
    if d.kind == "torch":
        if target and target.hidden and _int(hidden_cfg) and hidden_cfg != target.hidden:
            out.append(finding("hidden-size", "hidden_size", f"{v.where}: hidden_size {hidden_cfg}, the target's "
                               f"{target.hidden}"))
        return hidden_cfg if _int(hidden_cfg) else None
    fc = d.tensors().get("fc.weight")
    if fc is None:
        if d.files and not any(f.error for f in d.files):
            out.append(finding("weights-missing", "fc.weight", f"{d.where}: no fc.weight in the weights"))
        return hidden_cfg if _int(hidden_cfg) else None
    if len(fc.shape) != 2:
        out.append(finding("fc-width", "fc.weight", f"{d.where}: fc.weight has shape {list(fc.shape)}, not 2-D"))
        return None
    hidden = fc.shape[0]
    if target and target.hidden and hidden != target.hidden:
        out.append(finding("hidden-size", "fc.weight", f"{d.where}: the drafter's hidden size is {hidden} (fc.weight "
                           f"{list(fc.shape)}), the target's {target.hidden}"))
    if fc_ids is None:
        return hidden
    H = target.hidden if target and target.hidden else hidden
    width, want = fc.shape[1], len(fc_ids) * H
    if width != want:
        have = f"{width} = {width // H} × {H}" if width % H == 0 else f"{width} (not a multiple of {H})"
        hint = None
        if v.reserve_last and width == (len(fc_ids) + 1) * H:
            hint = "fc uses every listed layer: set reserve_last_target_layer: false"
        elif v.fmt == "training" and not v.reserve_last and width == (len(fc_ids) - 1) * H:
            hint = "fc skips the last listed layer: set reserve_last_target_layer: true"
        out.append(finding("fc-width", "fc.weight", f"{d.where}: fc.weight takes {have} inputs but {v.ids_field} "
                           f"gives {len(fc_ids)} layers {fc_ids} × {H} = {want}", hint))
    return hidden


def _block(v: View, out: list[Finding], engine_ks: Iterable[int]) -> int | None:
    inner, top = v.dcfg.get("block_size"), v.cfg.get("block_size")
    if v.fmt == "speculators":
        inner = None
    if inner is not None and top is not None and inner != top:
        out.append(finding("block-size-conflict", "block_size", f"{v.where}: dflash_config.block_size {inner}, "
                           f"top-level block_size {top}"))
        return None
    block = inner if inner is not None else top
    if block is None:
        out.append(finding("block-size-missing", "dflash_config.block_size", f"{v.where}: no block_size"))
        return None
    if not _int(block) or block < 2:
        out.append(finding("config-invalid", "block_size", f"{v.where}: block_size {block!r}: expected an integer "
                           ">= 2 (slot 0 holds the committed token)"))
        return None
    out.append(finding("block-size", "block_size", f"block {block}: engines draft K <= {block - 1} tokens per step; "
                       f"vLLM re-plans the block with K + 1 rows for a smaller K"))
    beyond = sorted(k for k in engine_ks if k > block - 1)
    if beyond:
        out.append(finding("k-beyond-block", "--engine-k", f"K {beyond} asked of a block-{block} drafter (at most "
                           f"{block - 1})"))
    return block


def _mask(v: View, target: Target | None, out: list[Finding]) -> None:
    field = "mask_token_id" if v.fmt in ("speculators", "training") else "dflash_config.mask_token_id"
    mask = v.dcfg.get("mask_token_id", v.cfg.get("mask_token_id"))
    if mask is None:
        out.append(finding("mask-missing", field, f"{v.where}: no mask_token_id"))
        return
    if not _int(mask):
        out.append(finding("config-invalid", field, f"{v.where}: mask_token_id {mask!r} is not an integer"))
        return
    if target is None:
        return
    tok = target.facts.tokenizer
    if target.vocab is not None and not 0 <= mask < target.vocab:
        out.append(finding("mask-out-of-vocab", field, f"{v.where}: mask_token_id {mask} is outside the target's "
                           f"vocabulary 0..{target.vocab - 1}"))
        return
    if mask in tok.regular and mask not in tok.added:  # an added token sits in a BPE vocabulary too
        out.append(finding("mask-regular-token", field, f"{v.where}: mask_token_id {mask} is the regular token "
                           f"{tok.regular[mask]!r} of the target's tokenizer"))
        return
    by_content = {content: tid for tid, (content, _special) in tok.added.items()}
    specials = {k: by_content.get(c) for k, c in tok.special_tokens.items()}
    hit = next((k for k, tid in specials.items() if tid == mask), None)
    content = tok.added.get(mask, (None, False))[0]
    if hit is not None or mask in tok.generation_eos or content in CHAT_TOKENS:
        what = (f"the tokenizer's {hit}" if hit else "a stop token (generation_config.eos_token_id)"
                if mask in tok.generation_eos else f"the chat-template token {content!r}")
        out.append(finding("mask-special-token", field, f"{v.where}: mask_token_id {mask} is {what}"))
        return
    kind = (f"added token {content!r}" + (" (special)" if tok.added[mask][1] else " (not marked special)")
            if mask in tok.added else "beyond the tokenizer's vocabulary (an embedding row no text maps to)"
            if tok.vocab_size is not None and mask >= tok.vocab_size else "not found in tokenizer.json")
    out.append(finding("mask-token", field, f"mask id {mask}: {kind}"))
    vocab_cfg = v.cfg.get("vocab_size") if v.fmt != "speculators" else None
    if target.vocab is not None and v.fmt in ("zlab", "training (stripped)"):
        if vocab_cfg is None:
            out.append(finding("vocab-size-missing", "vocab_size", f"{v.where}: no vocab_size (the target has "
                               f"{target.vocab})"))
        elif vocab_cfg != target.vocab:
            out.append(finding("vocab-size-mismatch", "vocab_size", f"{v.where}: vocab_size {vocab_cfg}, the "
                               f"target's {target.vocab}"))


def _layer_types(lc: dict) -> list | None:
    types = lc.get("layer_types")
    layers = lc.get("num_hidden_layers")
    if types is None and lc.get("use_sliding_window") and lc.get("sliding_window") and _int(layers):
        mwl = lc.get("max_window_layers", layers)  # Qwen3: layer i slides iff i >= max_window_layers
        types = [SLIDING if _int(mwl) and i >= mwl else FULL for i in range(layers)]
    return types if isinstance(types, list) else None


def _windows(v: View, out: list[Finding]) -> None:
    lc = v.layer_cfg
    types = _layer_types(lc) or []
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    window = lc.get("sliding_window")
    use_swa, swa = v.dcfg.get("use_swa"), v.dcfg.get("swa_window_size")
    if sliding and not _int(window):
        out.append(finding("window-missing", "sliding_window", f"{v.where}: layers {sliding} are sliding_attention "
                           f"but sliding_window is {window!r}"))
        return
    zlab_like = v.fmt != "speculators"
    # A training spec never carries vLLM's keys: dfo's export (strip, engine folder) writes them.
    if zlab_like and v.fmt != "training" and sliding and use_swa is not True:
        out.append(finding("window-vllm-full", "dflash_config.use_swa", f"{v.where}: layers {sliding} slide over "
                           f"{window} tokens in z-lab/transformers/dfo; vLLM would run them as full attention"))
    if zlab_like and use_swa is True:
        if not sliding:
            out.append(finding("window-types-full", "layer_types", f"{v.where}: dflash_config.use_swa is true, "
                               f"layer_types {types or '(none)'} lists no sliding_attention layer"))
        elif swa != window:
            out.append(finding("window-size-conflict", "dflash_config.swa_window_size", f"{v.where}: "
                               f"swa_window_size {swa!r}, sliding_window {window!r}"))
    is_causal = v.cfg.get("is_causal")
    if is_causal is not None and not isinstance(is_causal, bool):
        out.append(finding("config-invalid", "is_causal", f"{v.where}: is_causal {is_causal!r} is not true/false"))
    elif is_causal is True and len(sliding) < len(types):
        out.append(finding("window-is-causal", "is_causal", f"{v.where}: is_causal true with full-attention layers "
                           f"{[i for i, t in enumerate(types) if t != SLIDING]}"))
    if sliding and len(sliding) < len(types):
        out.append(finding("window-mixed-layers", "layer_types", f"{v.where}: layers {sliding} sliding, the others "
                           "full attention"))
    if v.fmt == "speculators":
        rule = "bidirectional" if v.cfg.get("sliding_window_non_causal") else "causal"
        text = (f"speculators: layers {sliding or 'none'} slide over {window} tokens, sliding layers {rule} in the "
                "block" if types else "speculators: no layer_types: speculators' default is every layer sliding "
                "(window 2048) and causal")
    else:
        causal = ("is_causal " + str(is_causal).lower() + " for every layer" if isinstance(is_causal, bool)
                  else "sliding layers causal, full layers bidirectional (z-lab's default)")
        text = (f"layers {sliding} slide over {window} tokens ({causal}); vLLM: "
                + (f"use_swa, window {swa}" if use_swa is True else "full attention") if sliding
                else f"every layer full attention ({causal})")
    out.append(finding("window", "layer_types", text))


def _dflash2(v: View, d: DrafterFacts, target: Target | None, out: list[Finding]) -> None:
    declared = declares_dflash2(v.cfg) or any(k in v.dcfg for k in DFLASH2_FIELDS) or "DFlash2" in str(
        v.cfg.get("architectures"))
    names = list(d.tensors())
    d2_keys = sorted(k for k in names if any(part in f".{k}" for part in DFLASH2_KEY_PARTS))
    if not declared:
        if d2_keys:
            out.append(finding("dflash2-weights-under-dflash", "architectures", f"{v.where}: DFlash config, DFlash2 "
                               f"weights {d2_keys[:3]}" + (f" (+{len(d2_keys) - 3} more)" if len(d2_keys) > 3
                                                          else "")))
        return
    missing = [k for k in DFLASH2_FIELDS if k not in v.dcfg]
    if missing:
        out.append(finding("dflash2-fields", "dflash_config", f"{v.where}: a DFlash2 config without "
                           + ", ".join(f"dflash_config.{k}" for k in missing)))
    if d.kind != "torch" and d.files and not d2_keys:
        out.append(finding("dflash2-weights-missing", "architectures", f"{d.where}: no attention_conv/mlp_conv or "
                           "candidate_selector weights"))
    rows = d.tensors().get("candidate_selector.predecessor_codebook")
    if rows is not None and target and target.vocab and rows.shape[:1] != (target.vocab,):
        out.append(finding("dflash2-vocab", "candidate_selector.predecessor_codebook", f"{d.where}: codebook "
                           f"{list(rows.shape)}, the target's vocabulary {target.vocab}"))
    out.append(finding("dflash2-engine", "architectures", "a DFlash2 drafter"))


def _dtypes(v: View, d: DrafterFacts, target: Target | None, out: list[Finding]) -> None:
    counts: dict[str, int] = {}
    for f in d.files:
        for dt, n in f.dtypes.items():
            counts[dt] = counts.get(dt, 0) + n
    embeds = {n: t for n, t in d.tensors().items() if n.endswith(("embed_tokens.weight", "lm_head.weight"))}
    drafter_q = quant_scheme(v.cfg)
    packed = sorted(dt for dt in counts if dt in QUANTIZED_DTYPES and dt not in ("I32", "U8") or dt in ("I4", "U4"))
    named = [n for n in d.tensors() if any(p in n for p in QUANTIZED_NAME_PARTS)]
    if "F16" in counts:
        out.append(finding("dtype-float16", "weights", f"{d.where}: {counts['F16']} tensor(s) in float16"))
    if drafter_q or packed or named:
        what = "; ".join(x for x in (f"quantization_config: {drafter_q}" if drafter_q else "",
                                      f"dtypes {packed}" if packed else "",
                                      f"tensors such as {named[0]}" if named else "") if x)
        out.append(finding("quantized-drafter", "weights", f"{d.where}: {what}; an NVFP4 target with an MXFP4 "
                           "drafter gave τ exactly 1.0 (vllm-project/vllm#49133), an FP8 draft KV cache 2.7 -> 1.8"))
    for name, t in embeds.items():
        if t.dtype in QUANTIZED_DTYPES and name != "d2t":
            out.append(finding("quantized-embedding", name, f"{d.where}: {name} is {t.dtype}"))
    if target and target.quant and drafter_q and _scheme_family(target.quant) != _scheme_family(drafter_q):
        out.append(finding("precision-pair-mismatch", "quantization_config", f"target {target.quant}, drafter "
                           f"{drafter_q}"))


def _scheme_family(label: str) -> str:
    low = label.lower()
    for fam in ("nvfp4", "mxfp4", "fp8", "int4", "4-bit", "8-bit"):
        if fam in low:
            return fam
    return low


def _embeddings(d: DrafterFacts, target: Target | None, hidden: int | None, out: list[Finding]) -> None:
    copies = {n: t for n, t in d.tensors().items() if n.endswith(("embed_tokens.weight", "lm_head.weight"))}
    if not copies or target is None:
        return
    theirs = target.facts.tensors()
    draft_vocab = "d2t" in d.tensors()
    compared = []
    for name, mine in copies.items():
        kind = "embed_tokens" if name.endswith("embed_tokens.weight") else "lm_head"
        other = _target_tensor(theirs, kind)
        if other is None:
            continue
        rows_differ = mine.shape[:1] != other.shape[:1] and not (kind == "lm_head" and draft_vocab)
        if len(mine.shape) != 2 or mine.shape[1:] != other.shape[1:] or rows_differ:
            out.append(finding("embedding-shape", name, f"{d.where}: {name} {list(mine.shape)}, the target's "
                               f"{other.name} {list(other.shape)}"))
            continue
        if kind == "lm_head" and draft_vocab:  # rows of a draft vocabulary (d2t): another order than the target's
            compared.append(f"{name} {list(mine.shape)}: a draft vocabulary (d2t), data not compared")
            continue
        if mine.sha256 and other.sha256 and mine.dtype == other.dtype and mine.shape == other.shape:
            if mine.sha256 != other.sha256:
                out.append(finding("embedding-differs", name, f"{d.where}: {name} sha256 {mine.sha256[:12]}…, the "
                                   f"target's {other.name} {other.sha256[:12]}…"))
                continue
            compared.append(f"{name}: same bytes as {other.name}")
        else:
            compared.append(f"{name} {list(mine.shape)} {mine.dtype}: shape as {other.name}"
                            + ("" if mine.sha256 else " (data not compared: --deep)"))
    if compared:
        out.append(finding("embedding-digest", "embed_tokens/lm_head", "; ".join(compared)))


def _target_tensor(tensors: dict[str, Tensor], kind: str) -> Tensor | None:
    ends = "embed_tokens.weight" if kind == "embed_tokens" else "lm_head.weight"
    found = sorted((n for n in tensors if n.endswith(ends) and "mtp" not in n), key=len)
    if not found and kind == "lm_head":  # tied embeddings: the head is the embedding table
        return _target_tensor(tensors, "embed_tokens")
    return tensors[found[0]] if found else None


def _training(v: View, target: Target | None, enable_thinking: bool | None, out: list[Finding]) -> None:
    block = v.cfg.get("training")
    if block is None:
        out.append(finding("training-metadata-missing", "training", f"{v.where}: no training block"))
        return
    if not isinstance(block, dict):
        out.append(finding("training-metadata-invalid", "training", f"{v.where}: training is "
                           f"{type(block).__name__}, not a mapping"))
        return
    th = block.get("enable_thinking")
    sha = block.get("chat_template_sha256")
    if th is not None and not isinstance(th, bool):
        out.append(finding("training-metadata-invalid", "training.enable_thinking", f"{v.where}: {th!r} is not "
                           "true/false"))
        th = None
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
        out.append(finding("training-metadata-invalid", "training.chat_template_sha256",
                           f"{v.where}: {str(sha)[:80]!r} is not 64 hex digits"))
        sha = None
    if th is None:
        out.append(finding("training-thinking-missing", "training.enable_thinking", f"{v.where}: training has no "
                           "enable_thinking"))
    elif enable_thinking is not None and th != enable_thinking:
        flag = "--enable-thinking" if th else "--no-enable-thinking"
        out.append(finding("thinking-differs", "training.enable_thinking", f"trained with enable_thinking="
                           f"{str(th).lower()}, the eval renders enable_thinking={str(enable_thinking).lower()}",
                           f"run with {flag}"))
    mine = target.facts.tokenizer.chat_template_sha256 if target else None
    if sha and mine and sha.lower() != mine:
        out.append(finding("chat-template-differs", "training.chat_template_sha256", f"trained with sha256 "
                           f"{sha[:12]}…, the target's template is {mine[:12]}…"))


def _spec_reader(v: View, shapes: dict, out: list[Finding]) -> None:
    """dfo's own reader on the same config: what it refuses that no rule above named."""
    try:
        if v.fmt == "speculators":
            from_speculators(v.cfg, shapes, v.where)
        elif v.fmt == "training":
            from_training(v.cfg, shapes, v.where)
        else:
            from_zlab(v.cfg, shapes, v.where)
    except PayloadError as exc:
        out.append(finding("config-invalid", v.where.rsplit("/", 1)[-1], str(exc)))
