"""``python -m remote_payload <subcommand>``: argument parsing and the error/exit-code contract.

Expected failures (PayloadError, bad arguments) exit non-zero with ONE stderr line starting
``dfo-payload error: `` and no traceback. Imports of torch/transformers happen inside the handlers, so
``--help`` and ``info`` work on a host without them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from remote_payload import __version__
from remote_payload.errors import PayloadError

EXIT_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, same prefix as every other expected error
        raise PayloadError(f"{self.prog}: {message}")


def _quiet_libraries() -> None:
    # Library chatter on stderr would break the one-error-line contract; progress goes to stdout as JSON.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

    def to_progress(message, category, filename, lineno, file=None, line=None):
        from remote_payload.progress import Progress

        Progress().warning(f"{category.__name__}: {message}")

    warnings.showwarning = to_progress


def _cmd_info(args) -> int:
    from remote_payload.info import collect

    data = collect()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        for k, v in data.items():
            print(f"{k}: {v}")
    return 0


def _cmd_eval(args) -> int:
    from remote_payload.eval.pipeline import run_eval
    from remote_payload.eval.settings import ENGINES, EvalSettings, parse_expect_p1, parse_named
    from remote_payload.inputs.prompts import parse_shard
    from remote_payload.progress import Progress

    specs = dict(parse_named(args.drafter_spec or [], "--drafter-spec"))
    settings = EvalSettings(
        target=args.target, drafters=parse_named(args.drafter, "--drafter"), drafter_specs=specs,
        prompts=args.prompts, samples=args.samples, shard=parse_shard(args.shard),
        max_new_tokens=args.max_new_tokens, enable_thinking=args.enable_thinking, device=args.device,
        dtype=args.dtype, allow_fp16=args.allow_fp16, cache_dir=args.cache_dir, out=args.out,
        online_check=args.online_check, seed=args.seed, topk=args.topk, kernel=args.kernel,
        tree_k=args.tree_k, tree_budget=args.tree_budget,
        reference_url=None if args.reference in ENGINES else args.reference,
        reference_engine=args.reference if args.reference in ENGINES else None,
        reference_model=args.reference_model,
        reference_timeout=args.reference_timeout, reference_concurrency=args.reference_concurrency,
        reference_retries=args.reference_retries,
        reference_prompt_format=args.reference_prompt_format,
        reference_strict_roundtrip=args.reference_strict_roundtrip,
        diagnose=args.diagnose, diagnose_samples=args.diagnose_samples, diagnose_rounds=args.diagnose_rounds,
        expect_p1=parse_expect_p1(args.expect_p1), threads=args.threads, engine=args.engine,
        engine_python=args.engine_python, engine_args=list(args.engine_arg or []),
        engine_start_timeout=args.engine_start_timeout)
    _set_threads(args.threads)
    run_eval(settings, Progress())
    return 0


def _cmd_strip(args) -> int:
    from remote_payload.models.export import strip_checkpoint
    from remote_payload.progress import Progress

    summary = strip_checkpoint(args.src, args.out_dir, args.spec)
    Progress().result(**summary)
    return 0


def _cmd_fixtures(args) -> int:
    from remote_payload.fixtures.build import ALL, build
    from remote_payload.progress import Progress

    what = ALL if args.what in (None, "all") else [w.strip() for w in args.what.split(",") if w.strip()]
    _set_threads(args.threads)
    manifest = build(args.out, what, use_cache=not args.no_cache, progress=Progress())
    Progress().result(out=str(args.out), built=sorted(manifest["items"]), cache=manifest.get("cache"))
    return 0


def _cmd_gpu_check(args) -> int:
    from remote_payload.diagnose.gpu_check import run
    from remote_payload.progress import Progress

    report = run(target=args.target, drafter=args.drafter, samples=args.samples,
                 max_new_tokens=args.max_new_tokens, out=args.out, progress=Progress(), synthetic=args.synthetic)
    print(json.dumps(report, indent=2))
    return 0


def _set_threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="remote_payload", description="dfo remote payload: DFlash drafter evaluation on this host")
    p.add_argument("--version", action="version", version=f"dfo-payload {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_eval(sub)
    _add_tools(sub)
    return p


def _add_eval(sub) -> None:
    e = sub.add_parser("eval", help="reference completions -> hidden states -> offline eval of every drafter")
    e.add_argument("--target", required=True, help="target model folder (HF format)")
    e.add_argument("--drafter", action="append", required=True, metavar="NAME=PATH",
                   help="drafter: z-lab/speculators folder or training checkpoint file (repeatable)")
    e.add_argument("--drafter-spec", action="append", metavar="NAME=SPECFILE",
                   help="spec sidecar (JSON/YAML) for a training checkpoint, or mask_token_id/block_size overrides")
    e.add_argument("--prompts", default="builtin", help="'builtin' or a JSONL file of {id, messages|prompt}")
    e.add_argument("--samples", type=int, help="use the first N prompts of the set (before sharding)")
    e.add_argument("--shard", metavar="I/N", help="evaluate every N-th selected prompt starting at I")
    e.add_argument("--max-new-tokens", type=int, default=512)
    e.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=False,
                   help="passed to the chat template (default: off); must match the drafter's training")
    e.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    e.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    e.add_argument("--allow-fp16", action="store_true", help="accept float16 (refused by default)")
    e.add_argument("--kernel", default="auto", choices=["auto", "fla", "torch"],
                   help="linear-attention kernels: auto = fla on CUDA when installed, torch otherwise")
    e.add_argument("--cache-dir", help="reference/feature cache (default $DFO_PAYLOAD_CACHE or ~/.cache/dfo-payload)")
    e.add_argument("--out", default="dfo-eval", help="output folder for results.json and samples.jsonl")
    e.add_argument("--online-check", action="store_true",
                   help="also run the online draft/verify loop and compare it with the offline path")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--topk", type=int, default=8,
                   help="per-depth top-k kept from the draft pass (default 8; raised to cover the tree metrics)")
    e.add_argument("--tree-k", type=int, default=8, metavar="K",
                   help="top-k depth acceptance ('DDTree-K', headline DDTree-8): k per depth (default 8)")
    e.add_argument("--tree-budget", type=int, default=16, metavar="N",
                   help="budgeted DDTree: nodes per round (default 16)")
    _add_reference_options(e)
    _add_engine_options(e)
    _add_diagnose_options(e)
    e.add_argument("--threads", type=int, help="torch CPU threads")
    e.set_defaults(func=_cmd_eval)


def _add_reference_options(e) -> None:
    e.add_argument("--reference", metavar="URL|vllm",
                   help="take reference completions from this OpenAI-compatible server (SGLang/vLLM, e.g. "
                        "http://127.0.0.1:30000/v1) instead of decoding with the target here; API key from "
                        "$DFO_REFERENCE_API_KEY. 'vllm': from a vLLM server this run starts on loopback itself "
                        "(needs --engine-python)")
    e.add_argument("--reference-model", metavar="NAME",
                   help="model name on the server (default: the only one it lists)")
    e.add_argument("--reference-timeout", type=float, default=900.0, metavar="S",
                   help="seconds per completion request (default 900)")
    e.add_argument("--reference-concurrency", type=int, default=4, metavar="N",
                   help="completion requests in flight (default 4)")
    e.add_argument("--reference-retries", type=int, default=2, metavar="N",
                   help="extra attempts after a connection failure or HTTP 5xx (default 2; timeouts are not retried)")
    e.add_argument("--reference-prompt-format", default="ids", choices=["ids", "text"],
                   help="send the templated prompt as token ids (default) or text")
    e.add_argument("--reference-strict-roundtrip", action="store_true",
                   help="stop when the server's text does not re-tokenise to its token ids (default: report it)")


def _add_engine_options(e) -> None:
    e.add_argument("--engine", choices=["vllm"],
                   help="after the offline eval, serve the target with each drafter as DFlash speculative config in "
                        "this engine (started on loopback here, stopped afterwards): engine acceptance, outputs and "
                        "tokens/s beside the offline figures (needs --engine-python)")
    e.add_argument("--engine-python", metavar="PATH",
                   help="python of the engine's own venv (`dfo provision --engine vllm` makes it)")
    e.add_argument("--engine-arg", action="append", metavar="ARG",
                   help="extra argument for the engine server, e.g. --engine-arg=--gpu-memory-utilization=0.8 "
                        "(repeatable)")
    e.add_argument("--engine-start-timeout", type=float, default=900.0, metavar="S",
                   help="seconds an engine server may take to become healthy (default 900)")


def _add_diagnose_options(e) -> None:
    e.add_argument("--diagnose", action="store_true",
                   help="diagnostics: hidden-state and fc statistics, embedding copies, probes for the pitfalls "
                        "(layer shift, slot 0, mask id), decoded first rounds; a report in results and on stdout")
    e.add_argument("--diagnose-samples", type=int, default=2, metavar="N",
                   help="samples (the first N) probed and shown round by round (default 2)")
    e.add_argument("--diagnose-rounds", type=int, default=4, metavar="N",
                   help="rounds shown decoded per diagnosed sample (default 4)")
    e.add_argument("--expect-p1", action="append", metavar="[NAME=]P",
                   help="position-1 acceptance expected from training (every drafter, or NAME=P); a run far "
                        "below it is flagged (repeatable)")


def _add_tools(sub) -> None:
    s = sub.add_parser("strip-checkpoint", help="training checkpoint -> drafter folder (safetensors + config)")
    s.add_argument("src", help="training checkpoint (torch file with 'model' and optimizer state)")
    s.add_argument("out_dir", help="output folder (model.safetensors, config.json, dfo-source.json)")
    s.add_argument("--spec", help="drafter spec sidecar (JSON/YAML) when the checkpoint has no 'config'")
    s.set_defaults(func=_cmd_strip)

    i = sub.add_parser("info", help="payload, python, torch, transformers, GPU and kernel-path facts")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_cmd_info)

    f = sub.add_parser("fixtures", help="build the tiny offline fixtures (targets, tokenizer, drafters)")
    f.add_argument("--out", required=True)
    f.add_argument("--what", help="comma list or 'all' (default): see README")
    f.add_argument("--no-cache", action="store_true", help="rebuild instead of copying a cached build")
    f.add_argument("--threads", type=int)
    f.set_defaults(func=_cmd_fixtures)

    g = sub.add_parser("gpu-check", help="GPU host: fla vs torch linear-attention path, per-layer diffs")
    g.add_argument("--target", help="target model folder (or --synthetic)")
    g.add_argument("--synthetic", action="store_true",
                   help="build a random target with Qwen3.5 layer shapes (no weights needed on the host)")
    g.add_argument("--drafter", metavar="PATH", help="optional drafter to compare drafts on both feature sets")
    g.add_argument("--samples", type=int, default=4)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--out", help="write the report JSON here too")
    g.set_defaults(func=_cmd_gpu_check)


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except PayloadError as exc:
        msg = " ".join(str(exc).split())
        print(f"dfo-payload error: {msg}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("dfo-payload error: interrupted", file=sys.stderr, flush=True)
        return 130
