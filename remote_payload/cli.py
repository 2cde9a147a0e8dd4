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
from remote_payload.eval.options import BY_FLAG, Option, payload_options

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
    from remote_payload.eval.settings import settings_from_values
    from remote_payload.progress import Progress

    settings = settings_from_values(vars(args))
    _set_threads(settings.threads)
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
    from remote_payload.eval.worker import add_parsers  # stdlib at import: --help stays light
    from remote_payload.models import strip_worker

    add_parsers(sub, _argparse_spec)
    strip_worker.add_parsers(sub)
    return p


def _add_eval(sub) -> None:
    e = sub.add_parser("eval", help="reference completions -> hidden states -> offline eval of every drafter")
    for option in payload_options():
        e.add_argument(option.flag, **_argparse_spec(option))
    e.set_defaults(func=_cmd_eval)


class _FlagOrWord(argparse.Action):
    """A negatable flag that may also be given a word: ``--x`` (True), ``--no-x`` (False), ``--x WORD``."""

    def __init__(self, option_strings, dest, **kwargs):
        flag = option_strings[0]
        super().__init__([flag, "--no-" + flag[2:]], dest, nargs="?", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        negative = bool(option_string and option_string.startswith("--no-"))
        if negative and values is not None:
            parser.error(f"{option_string} takes no value")
        parse = BY_FLAG[self.option_strings[0]].parse or (lambda v: v)
        try:
            value = False if negative else True if values is None else parse(values)
        except PayloadError as exc:
            parser.error(str(exc))
        setattr(namespace, self.dest, value)


def _argparse_spec(option: Option) -> dict:
    """add_argument's keywords for a declared option (remote_payload/eval/options.py)."""
    shown = option.default is not None and option.default is not False
    text = option.help.rstrip(".") + f" (default: {option.default})." if shown else option.help
    spec: dict = {"dest": option.field, "help": text.replace("%", "%%")}  # argparse formats help with %
    if option.words:  # --flag, --no-flag or --flag WORD (--enable-thinking both)
        spec.update(action=_FlagOrWord, default=option.default, metavar="|".join(option.words))
        return spec
    if option.kind is bool:
        spec["action"] = argparse.BooleanOptionalAction if option.negatable else "store_true"
        spec["default"] = option.default
        return spec
    spec.update(type=option.kind, metavar=option.value_text())
    if option.choices:
        spec["choices"] = option.choices
    if option.repeatable:
        spec["action"] = "append"  # default None: append would grow a shared default list
    if option.required:
        spec["required"] = True
    else:
        spec["default"] = option.default
    return spec


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
