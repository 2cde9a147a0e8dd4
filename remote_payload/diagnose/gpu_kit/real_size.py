"""Models at the real size from their published configurations alone: random weights, built on the device.

``data/qwen3.6-27b.config.json`` is Qwen3.6-27B's config.json (the ``qwen3_5`` family's, from public copies,
checked against the model card; its text model is ~26.9 B parameters, ~54 GB in bf16) and
``data/qwen3.6-27b-dflash.config.json`` the configuration of z-lab's DFlash drafter for it (5 layers, 4 sliding of
2048 then 1 full, fc over target layers 1, 16, 31, 46, 61; rope left at its default: it changes no cost). Both are
built with random weights,
directly on the device in the requested dtype (``torch.device`` as the default device while the modules are
made), so no weights are downloaded and no full-size copy ever sits in host memory. The target is wrapped as
the payload's own :class:`~remote_payload.models.target.Target`, so extraction, decoding and drafting run the
payload's code on it.

``toy=True`` scales both down (the overrides below; every other field as published) for the CPU smoke.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TARGET_CONFIG = DATA / "qwen3.6-27b.config.json"
DRAFTER_CONFIG = DATA / "qwen3.6-27b-dflash.config.json"
TARGET_NAME = "Qwen3.6-27B-random"
TOY_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=6, vocab_size=512, eos_token_id=2)
TOY_DRAFTER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   num_hidden_layers=2, num_target_layers=8, vocab_size=512, sliding_window=64, eos_token_id=2,
                   layer_types=["sliding_attention", "full_attention"],
                   dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 3, 5]})
INIT_STD = 0.02
# DFlash2's modules at the published DFlash2 drafters' settings (two taps, groups of 16 channels, a selector of
# rank 256 walking the top 16): added to the DFlash configuration above, the layers stay the same, so what the
# two drafters' costs differ by is the convolutions and the selector.
DFLASH2_FIELDS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


def target_config(toy: bool) -> dict:
    cfg = json.loads(TARGET_CONFIG.read_text())
    if toy:
        text = cfg["text_config"]
        text.update(TOY_TEXT)
        text["layer_types"] = text["layer_types"][:TOY_TEXT["num_hidden_layers"]]
        cfg["vision_config"]["out_hidden_size"] = TOY_TEXT["hidden_size"]
    return cfg


def drafter_config(toy: bool) -> dict:
    cfg = json.loads(DRAFTER_CONFIG.read_text())
    if toy:
        cfg.update(copy.deepcopy(TOY_DRAFTER))
    return cfg


def dflash2_config(toy: bool) -> dict:
    cfg = drafter_config(toy)
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"] = {**cfg["dflash_config"], **DFLASH2_FIELDS}
    return cfg


def build_target(config: dict, device: str, dtype: str, work: Path):
    """A random-weight target of ``config`` on ``device``, as the payload's Target (no tokenizer, no stop ids);
    its config.json is written into a folder under ``work``, read back as a target folder's would be.

    Call :func:`remote_payload.models.kernels.apply_policy` first, as load_target does, so the kernel path is
    chosen before transformers' modelling code is imported.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from remote_payload.models import kernels
    from remote_payload.models.target import Target, decoder_layers, read_target_config, resolve_dtype

    folder = work / TARGET_NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    cfg = read_target_config(folder)
    torch_dtype = resolve_dtype(dtype)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)), dtype=torch_dtype)
    model.eval()
    path_used, details = kernels.kernel_path(model)
    return Target(model=model, tokenizer=None, config=cfg, device=device, dtype=torch_dtype,
                  input_device=model.get_input_embeddings().weight.device, layers=decoder_layers(model), stop_ids=[],
                  kernel_path=path_used, kernel_details=details, digest={}, device_map=None)


def random_drafter_weights(spec, device: str, dtype, seed: int = 0, vocab: int | None = None) -> dict:
    """Random weights of the drafter ``spec`` made on ``device`` (names and shapes from a meta-device module;
    ``vocab``: the target's vocabulary, which a DFlash2 selector's codebooks have one row per token of)."""
    import torch

    from remote_payload.models.drafter import DFlashDrafter

    with torch.device("meta"):
        module = DFlashDrafter(spec, vocab)
        shapes = {k: v.shape for k, v in module.state_dict().items() if not k.startswith("rotary_emb.")}
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            out[name] = (torch.randn(shape, device=device, dtype=torch.float32, generator=gen) * INIT_STD).to(dtype)
    return out


def drafter_runtime(config: dict, target, seed: int = 0):
    """The payload's DrafterRuntime for a random drafter of ``config``, bound to ``target``'s embedding and head."""
    import torch

    from remote_payload.fixtures.models import loaded_from
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.models.spec import from_zlab

    spec = from_zlab(config, {}, DRAFTER_CONFIG.name)
    weights = random_drafter_weights(spec, target.device, target.dtype, seed, vocab=target.config.vocab_size)
    model = target.model
    with torch.device(target.device):  # the runtime's module is made on the device, not in host memory first
        runtime = DrafterRuntime(loaded_from(spec, weights), model.get_input_embeddings(),
                                 model.get_output_embeddings(), device=target.input_device, dtype=target.dtype)
    return spec, runtime
