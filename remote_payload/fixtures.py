"""Tiny offline fixtures: a Qwen3.5 target (CausalLM and VL wrapper), its tokenizer, and drafters.

Used by the payload tests and by ``dfo demo`` on sandbox hosts (no downloads possible). Everything is
deterministic (fixed seeds, fixed thread count) and cached on disk under a key hashed from the code and
parameters that build it ($DFO_FIXTURE_CACHE, default ~/.cache/dfo-payload/fixtures).

Items (``--what``; dependencies are built too):
- ``tokenizer``: byte-level BPE (512 ids) trained on the fixture corpus, Qwen-style chat template with
  ``enable_thinking``, special tokens incl. ``<|MASK|>``.
- ``target``: Qwen3_5ForCausalLM (8 layers L L L F L L L F, hidden 64) briefly trained to answer the
  built-in prompts, so its greedy continuations are structured and end with ``<|im_end|>``.
- ``target-vl``: the same text weights inside Qwen3_5ForConditionalGeneration (1-layer vision tower).
- ``trained-drafter`` (alias ``training-checkpoint``): a 2-layer DFlash drafter (block 8, one sliding and
  one full layer) trained on the target's own greedy outputs, saved in the team's training-checkpoint
  format (``checkpoint.pt`` with model + optimizer state) plus its ``spec.json`` sidecar
  (target_layer_ids [1, 3, 5, 7], the last reserved for the loss: fc over [1, 3, 5]).
- ``zlab-drafter``: the same weights as a z-lab folder (config.json + model.safetensors).
- ``speculators-drafter``: the same weights as a speculators folder (aux ids [2, 4, 6], embed/lm_head
  copies, a permuted draft vocabulary with its ``d2t`` map) — drafts identical to the other two.
- ``random-drafter``: same architecture, random weights, z-lab format.
- ``prompts``: a copy of the built-in prompt set.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .errors import PayloadError
from .progress import SILENT, Progress

ALL = ["tokenizer", "target", "target-vl", "trained-drafter", "zlab-drafter", "speculators-drafter",
       "random-drafter", "prompts"]
ALIASES = {"training-checkpoint": "trained-drafter"}
DEPS = {"target": ["tokenizer"], "target-vl": ["target"], "trained-drafter": ["target"],
        "zlab-drafter": ["trained-drafter"], "speculators-drafter": ["trained-drafter", "target"],
        "random-drafter": ["tokenizer"]}
THREADS = 1  # tiny models gain nothing from intra-op threads, and lose a lot on a busy machine
SEED = 1234
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|MASK|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{% endif %}")
TARGET = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4,
              max_position_embeddings=4096, tie_word_embeddings=False, rope_parameters={
                  "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
TARGET_TRAIN = dict(steps=60, lr=8e-3, warmup=10)
DRAFTER_SPEC = {"block_size": 8, "target_layer_ids": [1, 3, 5, 7], "reserve_last_target_layer": True,
                "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                "max_position_embeddings": 4096, "layer_types": ["sliding_attention", "full_attention"],
                "sliding_window": 64}
DRAFTER_TRAIN = dict(steps=45, lr=5e-3, max_new_tokens=160)
SOURCES = ("fixtures.py", "drafter.py", "spec.py", "checkpoint.py", "features.py", "reference.py", "target.py",
           "data/prompts.jsonl", "data/fixture_answers.jsonl")


def default_cache_root() -> Path:
    return Path(os.environ.get("DFO_FIXTURE_CACHE", Path.home() / ".cache" / "dfo-payload" / "fixtures"))


def build_key() -> str:
    import torch
    import transformers

    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    params = [TARGET, TARGET_TRAIN, DRAFTER_SPEC, DRAFTER_TRAIN, SEED, THREADS, SPECIALS, CHAT_TEMPLATE,
              torch.__version__, transformers.__version__]
    h.update(json.dumps(params, sort_keys=True).encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _deterministic():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _resolve(what) -> list[str]:
    items = []
    for w in what:
        w = ALIASES.get(w, w)
        if w not in ALL:
            raise PayloadError(f"fixtures --what: unknown item {w!r}; choose from {', '.join(ALL)} "
                               f"(or {', '.join(ALIASES)})")
        items.append(w)
    ordered: list[str] = []

    def add(item):
        for d in DEPS.get(item, []):
            add(d)
        if item not in ordered:
            ordered.append(item)

    for it in items:
        add(it)
    return ordered


def _corpus():
    from .prompts import load_prompts

    prompts, _ = load_prompts("builtin")
    answers = {}
    for line in (Path(__file__).parent / "data" / "fixture_answers.jsonl").read_text().splitlines():
        obj = json.loads(line)
        answers[obj["id"]] = obj["answer"]
    return [(p, answers[p.id]) for p in prompts]


# ---------------------------------------------------------------------------------------------------
# builders: each writes one item folder given the folders of its dependencies


def build_tokenizer(out: Path, deps: dict) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = []
    for p, answer in _corpus():
        texts += [p.messages[0][1], answer, "\n".join(f"{r}\n{c}" for r, c in p.messages)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TARGET["vocab_size"], special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sorted(texts) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<think>", "</think>", "<|MASK|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def build_target(out: Path, deps: dict) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from .target import render_prompt

    tok = _tokenizer(deps["tokenizer"])
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen3_5TextConfig(**TARGET, eos_token_id=im_end, pad_token_id=eot, bos_token_id=None)
    torch.manual_seed(SEED)
    model = Qwen3_5ForCausalLM(cfg)
    seqs = []
    for p, answer in _corpus():  # no-thinking template only: what the fixture drafters are trained for
        ids = render_prompt(tok, p.message_dicts(), False)
        seqs.append(ids + tok(answer, add_special_tokens=False)["input_ids"] + [im_end])
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), eot)
    labels = torch.full((len(seqs), L), -100)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        labels[i, :len(s)] = torch.tensor(s)
    opt = torch.optim.AdamW(model.parameters(), lr=TARGET_TRAIN["lr"], weight_decay=0.0)
    steps, warm = TARGET_TRAIN["steps"], TARGET_TRAIN["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * max(0.05, 1 - s / steps))
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot, do_sample=False)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "dfo-fixture.json").write_text(json.dumps({"final_loss": round(loss.item(), 4)}) + "\n")


def build_target_vl(out: Path, deps: dict) -> None:
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    text = Qwen3_5ForCausalLM.from_pretrained(str(deps["target"]), local_files_only=True, dtype=torch.float32)
    tcfg = text.config.to_dict()
    for k in ("architectures", "transformers_version", "dtype", "torch_dtype", "model_type"):
        tcfg.pop(k, None)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=TARGET["hidden_size"],
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=1, in_channels=3, num_position_embeddings=64)
    cfg = Qwen3_5Config(text_config=tcfg, vision_config=vision, tie_word_embeddings=False)
    cfg.eos_token_id = text.config.eos_token_id
    cfg.pad_token_id = text.config.pad_token_id
    torch.manual_seed(SEED + 1)
    vl = Qwen3_5ForConditionalGeneration(cfg)
    src = text.state_dict()
    mapped = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
              for k, v in src.items()}
    missing, unexpected = vl.load_state_dict(mapped, strict=False)
    if unexpected or any(not m.startswith("model.visual.") for m in missing):
        raise PayloadError(f"fixture target-vl: weight mapping failed (missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]})")
    vl.generation_config = text.generation_config
    vl.save_pretrained(str(out))
    _tokenizer(deps["target"]).save_pretrained(str(out))


def _drafter_spec_dict(mask_id: int) -> dict:
    return {**DRAFTER_SPEC, "mask_token_id": mask_id}


def _loaded_from(spec, weights):
    from .checkpoint import LoadedDrafter

    return LoadedDrafter(spec=spec, weights=weights, extras={}, source={})


def _random_drafter_weights(spec, seed: int) -> dict:
    import torch

    from .drafter import DFlashDrafter

    torch.manual_seed(seed)
    model = DFlashDrafter(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                torch.nn.init.normal_(p, std=0.05)
    return {k: v.detach().clone() for k, v in model.state_dict().items() if not k.startswith("rotary_emb.")}


def build_trained_drafter(out: Path, deps: dict, progress: Progress = SILENT) -> None:
    import torch

    from .drafter import DrafterRuntime
    from .features import extract
    from .metrics import summarize
    from .offline import draft_sample, replay
    from .reference import greedy_decode
    from .spec import from_training
    from .target import load_target, render_prompt

    target = load_target(deps["target"], device="cpu", dtype="float32")
    target.model.requires_grad_(False)
    mask_id = target.tokenizer.convert_tokens_to_ids("<|MASK|>")
    spec_dict = _drafter_spec_dict(mask_id)
    spec = from_training(spec_dict, {}, "fixture drafter spec")
    samples = []
    for p, _ in _corpus():
        ids = render_prompt(target.tokenizer, p.message_dicts(), False)
        ref = greedy_decode(target, ids, DRAFTER_TRAIN["max_new_tokens"])
        feats = extract(target, ref.tokens, spec.fc_layer_ids, len(ids), with_argmax=False)
        samples.append((ref, feats))
    weights = _random_drafter_weights(spec, SEED + 2)
    rt = DrafterRuntime(_loaded_from(spec, weights), target.model.get_input_embeddings(),
                        target.model.get_output_embeddings(), dtype=torch.float32)
    params = [p for p in rt.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=DRAFTER_TRAIN["lr"], weight_decay=0.0)
    steps = DRAFTER_TRAIN["steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.05, 1 - s / steps))
    B = spec.block_size
    rt.model.train()
    for step in range(steps):
        total = 0.0
        for ref, feats in samples:
            tokens = torch.tensor(ref.tokens)
            P, S = len(ref.prompt_ids), len(ref.tokens)
            anchors = torch.arange(P, S - 1)
            ctx = rt.prepare(feats.layers, grad=True)
            h = rt.hidden(ctx, tokens, anchors, grad=True)  # [A, B-1, H]
            tgt_pos = anchors[:, None] + torch.arange(1, B)[None]
            valid = tgt_pos < S
            labels = torch.where(valid, tokens[tgt_pos.clamp(max=S - 1)], torch.full_like(tgt_pos, -100))
            logits = rt.logits(h)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                     ignore_index=-100)
            (loss / len(samples)).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 15 == 0 or step == steps - 1:
            progress.progress("fixtures:trained-drafter", step + 1, steps, unit="steps",
                              message=f"loss {total / len(samples):.3f}")
    rt.model.eval()
    rounds = [replay(draft_sample(rt, f.layers, r.tokens, len(r.prompt_ids))) for r, f in samples]
    tau = summarize(rounds, B)["tau_macro"]
    state = {k: v.detach().clone() for k, v in rt.model.state_dict().items() if not k.startswith("rotary_emb.")}
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state, "optimizer": opt.state_dict(), "step": steps, "epoch": 1}, str(out / "checkpoint.pt"))
    (out / "spec.json").write_text(json.dumps(spec_dict, indent=2) + "\n")
    (out / "dfo-fixture.json").write_text(json.dumps({"tau_macro_train_prompts": round(tau, 4),
                                                      "final_loss": round(total / len(samples), 4)}) + "\n")


def build_zlab_drafter(out: Path, deps: dict) -> None:
    from .checkpoint import load_drafter, write_zlab_folder

    ld = load_drafter(deps["trained-drafter"] / "checkpoint.pt", deps["trained-drafter"] / "spec.json")
    spec = ld.spec
    spec.reserved_layer_ids = []  # a z-lab folder lists only the layers feeding fc
    write_zlab_folder(out, spec, ld.weights)


def build_speculators_drafter(out: Path, deps: dict) -> None:
    import torch
    from safetensors.torch import save_file

    from .checkpoint import load_drafter
    from .target import load_target

    ld = load_drafter(deps["trained-drafter"] / "checkpoint.pt", deps["trained-drafter"] / "spec.json")
    spec = ld.spec
    target = load_target(deps["target"], device="cpu", dtype="float32")
    embed = target.model.get_input_embeddings().weight.detach().clone()
    head = target.model.get_output_embeddings().weight.detach().clone()
    vocab = head.shape[0]
    gen = torch.Generator().manual_seed(SEED + 3)
    perm = torch.randperm(vocab, generator=gen)  # draft id i <-> target id perm[i]
    d2t = perm - torch.arange(vocab)
    weights = {**ld.weights, "embed_tokens.weight": embed, "lm_head.weight": head[perm].contiguous(),
               "d2t": d2t.to(torch.int64), "t2d": torch.ones(vocab, dtype=torch.bool)}
    layer_cfg = {"model_type": "qwen3", "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
                 "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
                 "head_dim": spec.head_dim, "intermediate_size": spec.intermediate_size,
                 "rms_norm_eps": spec.rms_norm_eps, "hidden_act": "silu", "vocab_size": vocab,
                 "max_position_embeddings": spec.max_position_embeddings, "rope_parameters": dict(spec.rope),
                 "layer_types": [a.kind for a in spec.attn], "sliding_window": DRAFTER_SPEC["sliding_window"]}
    cfg = {"speculators_model_type": "dflash", "architectures": ["DFlashDraftModel"],
           "transformer_layer_config": layer_cfg, "draft_vocab_size": vocab, "block_size": spec.block_size,
           "aux_hidden_state_layer_ids": [i + 1 for i in spec.fc_layer_ids], "mask_token_id": spec.mask_token_id,
           "sliding_window_non_causal": False,
           "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy"}}
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def build_random_drafter(out: Path, deps: dict) -> None:
    from .checkpoint import write_zlab_folder
    from .spec import from_training

    mask_id = _tokenizer(deps["tokenizer"]).convert_tokens_to_ids("<|MASK|>")
    spec = from_training({**_drafter_spec_dict(mask_id), "reserve_last_target_layer": True}, {}, "fixture")
    spec.reserved_layer_ids = []
    spec.format = "zlab"
    write_zlab_folder(out, spec, _random_drafter_weights(spec, SEED + 4))


def build_prompts(out: Path, deps: dict) -> None:
    from .prompts import BUILTIN

    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BUILTIN, out / "prompts.jsonl")


BUILDERS = {"tokenizer": build_tokenizer, "target": build_target, "target-vl": build_target_vl,
            "trained-drafter": build_trained_drafter, "zlab-drafter": build_zlab_drafter,
            "speculators-drafter": build_speculators_drafter, "random-drafter": build_random_drafter,
            "prompts": build_prompts}


# ---------------------------------------------------------------------------------------------------
# orchestration with the on-disk cache


@contextlib.contextmanager
def _locked(folder: Path):
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _build_into(root: Path, items: list[str], progress: Progress) -> dict:
    """Build missing items into root (each item atomically: temp folder, then rename)."""
    timings = {}
    for item in items:
        final = root / item
        if final.exists():
            continue
        started = time.perf_counter()
        progress.progress("fixtures", 0, 1, unit="item", message=f"building {item}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{item}.", dir=root))
        try:
            deps = {d: root / d for d in DEPS.get(item, [])}
            builder = BUILDERS[item]
            with _deterministic():
                if item == "trained-drafter":
                    builder(tmp, deps, progress)
                else:
                    builder(tmp, deps)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        timings[item] = round(time.perf_counter() - started, 2)
        progress.progress("fixtures", 1, 1, unit="item", message=f"built {item} in {timings[item]} s")
    return timings


def build(out: str | os.PathLike, what=None, use_cache: bool = True, progress: Progress = SILENT) -> dict:
    """Build (or copy from the cache) the requested fixture items into ``out``; returns the manifest."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from . import kernels

    kernels.apply_policy("cpu")
    items = _resolve(what or ALL)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if use_cache:
        root = default_cache_root() / build_key()
        with _locked(root):
            timings = _build_into(root, items, progress)
        for item in items:
            dst = out / item
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(root / item, dst)
    else:
        root = out
        timings = _build_into(out, items, progress)
    manifest = {"schema": "dfo.fixtures/1", "key": build_key(), "cache": str(root) if use_cache else None,
                "items": {item: {"digest": _tree_digest(out / item)} for item in items},
                "built_s": timings}
    for item in items:
        info = out / item / "dfo-fixture.json"
        if info.exists():
            manifest["items"][item].update(json.loads(info.read_text()))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
