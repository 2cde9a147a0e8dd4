"""The declared eval options (remote_payload/eval/options.py) as typer options of `dfo eval` and `dfo watch`,
and the local prompts file, read the way the payload reads it."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from orchestrator.core.errors import InputError
from orchestrator.evaluation.datasets import suite_max_new_tokens
from remote_payload.errors import PayloadError
from remote_payload.eval.options import Option, offered
from remote_payload.inputs.prompts import load_prompts

DECLARED: Any = object()  # the parameter that stands for the declared options in a command's signature


def with_eval_options(command: str) -> Callable:
    """Puts every option COMMAND offers where the command has ``options=DECLARED``; the command gets their
    values as ``options`` (a dict by EvalRequest field)."""

    def decorate(func: Callable) -> Callable:
        declared = offered(command)
        own = inspect.signature(func, eval_str=True)
        params: list[inspect.Parameter] = []
        for p in own.parameters.values():
            if p.name == "options":
                params += [inspect.Parameter(o.field, inspect.Parameter.KEYWORD_ONLY, default=typer_option(o),
                                             annotation=_annotation(o)) for o in declared]
                params += [inspect.Parameter(_word_field(o, w), inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                             default=typer.Option(False, _word_flag(o, w), hidden=True,
                                                                  help=f"{o.flag} {w} (the form to type)."))
                           for o in declared for w in o.words]
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(func)
        def command_func(**kwargs: Any) -> Any:
            values = {o.field: kwargs.pop(o.field) for o in declared}
            for o in declared:  # `--enable-thinking both` arrives as its hidden flag (flag_words)
                for w in o.words:
                    if kwargs.pop(_word_field(o, w)):
                        values[o.field] = w
            context = next((v for v in kwargs.values() if hasattr(v, "get_parameter_source")), None)
            return func(**kwargs, options=with_suite_defaults(values, context))

        # inspect.signature (and so typer) reads __signature__; mypy's function type does not declare it.
        command_func.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        command_func.__annotations__ = {p.name: p.annotation for p in params}
        return command_func

    return decorate


def _word_field(option: Option, word: str) -> str:
    return f"{option.field}_{word}"


def _word_flag(option: Option, word: str) -> str:
    return f"{option.flag}-{word}"


def with_suite_defaults(values: dict[str, Any], context: typer.Context | None) -> dict[str, Any]:
    """--suite's own output length (z-lab's 2048) where --max-new-tokens was not given on the command line
    (``context``: the command's, which says where each value came from)."""
    suite_max_new = suite_max_new_tokens(values.get("suite"))
    if suite_max_new is not None and "max_new_tokens" in values:
        source = context.get_parameter_source("max_new_tokens") if context is not None else None
        if source is None or source.name == "DEFAULT":
            values = {**values, "max_new_tokens": suite_max_new}
    return values


def typer_option(option: Option) -> Any:
    help_text = option.dfo_help or option.help
    default = option.request_default
    if default is None and option.default is not None and option.kind is not bool:
        help_text = help_text.rstrip(".") + f" (default: the payload's {option.default})."
    if option.kind is bool:
        decl = f"{option.flag}/--no-{option.flag[2:]}" if option.negatable else option.flag
        return typer.Option(default, decl, help=help_text, show_default=option.negatable and default is not None)
    return typer.Option(... if option.required else default, option.flag, help=help_text,
                        metavar=option.dfo_metavar or option.value_text(),
                        show_default=default not in (None, []))


def _annotation(option: Option) -> Any:
    if option.repeatable:
        return list[str]
    if option.required or option.request_default is not None:
        return option.kind
    return _OPTIONAL[option.kind]


_OPTIONAL = {int: Optional[int], float: Optional[float], str: Optional[str], bool: Optional[bool]}


# ------------------------------------------------------------------------------ the prompts file


@dataclass(frozen=True)
class LocalPrompts:
    spec: str                 # what the request names: "builtin" or the file's absolute path
    file: Path | None         # the file to upload (None: the payload's built-in set)
    digest: str | None        # its sha256 (it is uploaded under a content name)
    count: int                # prompts in the set


def read_prompts(spec: str) -> LocalPrompts:
    """--prompts parsed here with the payload's own parser, so a bad line is reported before anything moves."""
    if spec != "builtin" and not Path(spec).is_file():
        raise InputError(f"--prompts {spec!r}: no such local file", hint="give a JSONL file here, or 'builtin'")
    try:
        prompts, facts = load_prompts(spec)
    except PayloadError as exc:
        raise InputError(f"--prompts {spec}: {exc}", hint='each line is one JSON object: {"id": ..., "messages": '
                         '[{"role": "user", "content": ...}]} or {"id": ..., "prompt": ...}') from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--prompts {spec}: cannot read it ({exc})", hint="give a UTF-8 JSONL file") from None
    if spec == "builtin":
        return LocalPrompts("builtin", None, None, len(prompts))
    path = Path(spec).resolve()
    return LocalPrompts(str(path), path, facts["sha256"], len(prompts))
