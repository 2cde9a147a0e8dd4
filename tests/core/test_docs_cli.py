"""Every `dfo ...` command form that README.md and docs/*.md show exists in the real CLI.

A form is a `$ dfo ...` line of a fenced block or an inline code span that starts with `dfo `. Its words are
walked through the (click) command typer builds from the app (all command modules registered): each command and
sub-command must exist, and each option (`--name`, `--name=value`, `-x`) must be one of that command's, or of
dfo's own before the command. Placeholders (`…`, `[--json]`'s brackets, `HOST:DIR`) and what follows `--`, a
pipe, `;` or `#` are not options. Pure introspection: no host, no sandbox.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from orchestrator.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
FENCE_FORM = re.compile(r"^\s*\$ (dfo\b.*)$")
INLINE_FORM = re.compile(r"`(dfo [^`]+)`")
STOP = {"|", ";", "&&", "||", ">", ">>", "#", "--"}


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def forms(text: str) -> list[tuple[int, str]]:
    """(line, command form) of every `dfo ...` the text shows; a fenced form's `\\` continuations are joined."""
    found: list[tuple[int, str]] = []
    lines = text.splitlines()
    fenced = False
    n = 0
    while n < len(lines):
        line = lines[n]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and (match := FENCE_FORM.match(line)):
            start, form = n + 1, match.group(1)
            while form.rstrip().endswith("\\") and n + 1 < len(lines):
                n += 1
                form = form.rstrip()[:-1] + " " + lines[n].strip()
            found.append((start, form))
        elif not fenced:
            found += [(n + 1, m) for m in INLINE_FORM.findall(line)]
        n += 1
    return found


def words(form: str) -> list[str]:
    """The form's words up to the first pipe, comment, `--` or shell operator, placeholders dropped."""
    try:
        tokens = shlex.split(form, comments=True)
    except ValueError:  # an unbalanced quote in prose: read it word by word
        tokens = form.split()
    out = []
    for token in tokens[1:]:
        if token in STOP:
            break
        token = token.strip("[]")
        if token and "…" not in token and token != "...":
            out.append(token)
    return out


def option_names(command: Any) -> set[str]:
    return {name for param in command.params if param.param_type_name == "option"
            for name in (*param.opts, *param.secondary_opts)} | {"-h", "--help"}


def takes_value(command: Any, name: str) -> bool:
    return any(name in (*param.opts, *param.secondary_opts) and not param.is_flag and not param.count
               for param in command.params if param.param_type_name == "option")


def problems(form: str, root: Any) -> list[str]:
    """What in FORM the CLI does not have (empty when it matches)."""
    command, path, bad = root, ["dfo"], []
    value_next = False
    for word in words(form):
        if value_next:  # the value of the option before (`-i PATH`), not a command
            value_next = False
        elif word.startswith("-") and len(word) > 1 and not word[1:2].isdigit():
            name = word.split("=", 1)[0]
            if name not in option_names(command):
                bad.append(f"{' '.join(path)} has no option {name}")
            value_next = "=" not in word and takes_value(command, name)
        elif is_group(command):
            sub = command.commands.get(word)
            if sub is None:
                bad.append(f"{' '.join(path)} has no command {word!r}")
                break
            command, path = sub, [*path, word]
    return bad


def is_group(command: Any) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


def root_command() -> Any:
    cli_main._register([])  # every command module
    return cli_main.command()


def test_every_dfo_form_in_the_docs_matches_the_cli():
    root = root_command()
    bad = [f"{path.relative_to(REPO)}:{line}: `{form}`: {problem}"
           for path in doc_files() for line, form in forms(path.read_text(encoding="utf-8"))
           for problem in problems(form, root)]
    assert bad == [], "the docs show command forms the CLI does not have:\n" + "\n".join(bad)


def test_the_docs_show_every_command():
    root = root_command()
    shown = {" ".join(w for w in words(form) if not w.startswith("-"))
             for path in doc_files() for _, form in forms(path.read_text(encoding="utf-8"))}
    missing = [name for name in root.commands if not any(s.split(" ")[0] == name for s in shown if s)]
    assert missing == [], f"commands no page shows: {missing}"


def test_the_check_catches_what_it_is_for():
    root = root_command()
    text = ("```\n$ dfo eval --host ct129 --no-such-option 1 \\\n      --samples 4\n$ dfo jobs frobnicate\n```\n"
            "Prose: `dfo relay-checkpoint kpro6:a ct129:b --streams 2`, `dfo inventory show [--json]`, "
            "`dfo jobs run -H ct129 -- python --anything`, `dfo eval --dtyp=float32`, `dfo runs`, "
            "`dfo -i x.yaml inventory check`, `dfo --connect-timeout 5 jobs list`.\n")
    found = {form: problems(form, root) for _, form in forms(text)}
    assert found == {
        "dfo eval --host ct129 --no-such-option 1  --samples 4": ["dfo eval has no option --no-such-option"],
        "dfo jobs frobnicate": ["dfo jobs has no command 'frobnicate'"],
        "dfo relay-checkpoint kpro6:a ct129:b --streams 2": [],
        "dfo inventory show [--json]": [],
        "dfo jobs run -H ct129 -- python --anything": [],
        "dfo eval --dtyp=float32": ["dfo eval has no option --dtyp"],
        "dfo runs": [],
        "dfo -i x.yaml inventory check": [],
        "dfo --connect-timeout 5 jobs list": [],
    }


# ------------------------------------------------------------------------------ `--flag` in prose

PROSE_FLAG = re.compile(r"`(--[a-z][a-z0-9-]*)")
# Flags of other programs a page names, by program: they are not dfo's, and each page says whose they are.
FOREIGN = {
    "sbatch / Slurm": {"--option", "--array", "--output", "--error", "--chdir", "--job-name", "--wrap", "--export",
                       "--gpus-per-task", "--outp"},  # --outp: sbatch's prefix of --output
    "vLLM / SGLang servers": {"--model", "--api-key", "--speculative-config", "--model-path", "--config",
                              "--speculative-", "--tensor-parallel-size", "--speculative-algorithm"},
    "apt-get, pip": {"--no-install-recommends", "--no-deps"},
    "scripts/test.sh": {"--quick"},
    "vllm-project/speculators' converter": {"--include-last-layer"},
    "z-lab's benchmark": {"--max-samples"},
    "benchmarks/relay_bench.py": {"--size"},
}
PAYLOAD_CONTEXT = 2  # lines before a payload-only flag that may say it is the payload's


def all_option_names(command: Any) -> set[str]:
    names = option_names(command)
    for sub in (getattr(command, "commands", None) or {}).values():
        names |= all_option_names(sub)
    return names


def payload_option_names() -> set[str]:
    from remote_payload.eval.options import payload_options

    return {o.flag for o in payload_options()} | {"--no-" + o.flag[2:] for o in payload_options() if o.negatable}


def prose_flag_problems(text: str, dfo_flags: set[str], payload_flags: set[str]) -> list[tuple[int, str]]:
    """(line, flag) for each `--flag` of a prose code span that no dfo command has, that is not the payload's
    where the page says so (the word "payload" on its line or just before), and that no other program named in
    FOREIGN has. Fenced blocks (commands and their output) are test_every_dfo_form_in_the_docs_matches_the_cli's."""
    foreign = set().union(*FOREIGN.values())
    lines, fenced, bad = text.splitlines(), False, []
    for n, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for flag in PROSE_FLAG.findall(line):
            if flag in dfo_flags or flag in foreign:
                continue
            context = " ".join(lines[max(0, n - PAYLOAD_CONTEXT):n + 1])
            if flag in payload_flags and "payload" in context:
                continue
            bad.append((n + 1, flag))
    return bad


def test_every_flag_the_docs_name_in_prose_exists():
    flags, payload = all_option_names(root_command()), payload_option_names()
    bad = [f"{path.relative_to(REPO)}:{line}: {flag}" for path in doc_files()
           for line, flag in prose_flag_problems(path.read_text(encoding="utf-8"), flags, payload)]
    assert bad == [], "the docs name flags no dfo command has (a payload option: say it is the payload's):\n" + \
        "\n".join(bad)


def test_the_prose_flag_check_catches_what_it_is_for():
    flags, payload = all_option_names(root_command()), payload_option_names()
    text = ("With `--topk` above K a warning names the ranks.\n"  # the payload's, not said: refused
            "The payload's `--topk 16` is given as `--payload-arg=--topk=16`.\n"
            "`--samples 4` and `--no-resident` are dfo's; `--frobnicate` is nobody's.\n"
            "```\n$ dfo eval --anything-in-a-fence\n```\n")
    assert prose_flag_problems(text, flags, payload) == [(1, "--topk"), (3, "--frobnicate")]
