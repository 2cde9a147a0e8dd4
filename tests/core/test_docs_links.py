"""The README and docs/ hold together: every relative link and anchor resolves, and every `dfo …` command they
show is one the CLI has, with options that command takes.

The docs are the manual now that the README is short: a page moved or renamed, an option renamed or dropped,
shows up here instead of in a reader's terminal.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "SECURITY.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the Markdown outside ``` fences."""
    out, fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for _, line in outside_fences(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            base = slug(m.group(1))
            name, k = base, 1
            while name in found:  # GitHub numbers repeated headings
                name, k = f"{base}-{k}", k + 1
            found.add(name)
    return found


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    bad = []
    for n, line in outside_fences(page.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for m in LINK.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}:{n}: {target}"
            if not dest.exists():
                bad.append(f"{where} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                bad.append(f"{where} (no such heading)")
    return bad


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    bad = [b for page in PAGES for b in broken_links(page)]
    assert bad == [], "broken links:\n" + "\n".join(bad)


def test_every_page_of_docs_is_reachable_from_the_readme():
    """A page nobody links to is a page nobody reads: each docs/*.md is linked from the README or another page."""
    linked = set()
    for page in PAGES:
        for _, line in outside_fences(page.read_text(encoding="utf-8")):
            for m in LINK.finditer(line):
                target = (m.group(1) or m.group(2)).partition("#")[0]
                if target and not re.match(r"^[a-z]+:", target):
                    linked.add((page.parent / target).resolve())
    orphans = [p.name for p in (REPO / "docs").glob("*.md") if p.resolve() not in linked]
    assert orphans == []


def test_the_link_check_finds_what_it_is_for(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n## τ at T > 0 (`--temperature T`)\n## Same\n## Same\n"
                                   "```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md) [ok](a.md#top) [ok](a.md#τ-at-t--0---temperature-t) [ok](a.md#same-1)\n"
                    "[bad](a.md#not-a-heading) [bad](missing.md) `[code](nowhere.md)` [web](https://x.org/y)\n")
    assert [b.split(": ", 1)[1] for b in broken_links(page, tmp_path)] == [
        "a.md#not-a-heading (no such heading)", "missing.md (no such file)"]


# ------------------------------------------------------------------------------ command forms

def cli_tree():
    from orchestrator.cli import main as cli_main

    for module in cli_main.COMMAND_MODULES.values():
        __import__(f"orchestrator.cli.{module}")
    return cli_main.command()


def options_of(command) -> set[str]:
    own = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}
    return own | {"-h", "--help"}  # every command's, from the app's context settings


def command_lines(page: Path) -> list[tuple[int, str]]:
    """(line, command) of every dfo invocation a page shows: `$ dfo …` lines in code blocks (continuation lines
    joined) and `dfo …` code spans in the prose."""
    out, fence, pending = [], False, None
    for n, raw in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if line.startswith("```"):
            fence = not fence
            continue
        if fence:
            if pending is not None:
                pending = (pending[0], pending[1] + " " + line.rstrip("\\"))
                if not line.endswith("\\"):
                    out.append(pending)
                    pending = None
                continue
            m = re.match(r"^(?:\$ )?(dfo\s.*|\.venv/bin/dfo\s.*)$", line)
            if m:
                cmd = m.group(1).split(" # ")[0].split("  #")[0]
                if cmd.endswith("\\"):
                    pending = (n, cmd.rstrip("\\"))
                else:
                    out.append((n, cmd))
        else:
            out += [(n, span) for span in re.findall(r"`((?:\.venv/bin/)?dfo [^`]+)`", raw)]
    return out


def check_command(root, text: str) -> str | None:
    """None when TEXT is a command the CLI has with options it takes, else what is wrong."""
    text = text.replace("…", " ").replace("[", " ").replace("]", " ")
    try:
        words = shlex.split(text, comments=False)
    except ValueError:
        words = text.split()
    words = words[1:]  # "dfo"
    command, path = root, ["dfo"]
    allowed = options_of(root)
    for word in words:
        if word in ("|", "&&", ";", ">", "2>&1", "--") or word.startswith(("|", ">")):
            break  # another command, or the end of dfo's options (`dfo jobs run -H h -- CMD`)
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            if name not in allowed:
                return f"{' '.join(path)} has no option {name}"
            continue
        subs = getattr(command, "commands", None)
        if subs is not None:
            if word in subs:
                command = subs[word]
                path.append(word)
                allowed = allowed | options_of(command)
                continue
            if word.isupper() or not re.match(r"^[a-z][a-z-]*$", word):
                continue  # a placeholder where a sub-command goes (dfo jobs STATUS…)
            return f"{' '.join(path)} has no command {word}"
    return None


@pytest.fixture(scope="module")
def root():
    return cli_tree()


def test_every_command_the_docs_show_is_the_clis(root):
    bad = []
    for page in PAGES:
        for n, cmd in command_lines(page):
            problem = check_command(root, cmd.replace(".venv/bin/dfo", "dfo"))
            if problem:
                bad.append(f"{page.relative_to(REPO)}:{n}: `{cmd}`: {problem}")
    assert bad == [], "the docs show commands the CLI does not have:\n" + "\n".join(bad)


def test_the_command_check_finds_what_it_is_for(root):
    assert check_command(root, "dfo eval --host ct129 --samples 4") is None
    assert check_command(root, "dfo --inventory x.yaml inventory check --connect") is None
    assert check_command(root, "dfo series list | show run7") is None
    assert check_command(root, "dfo eval --no-such-option") == "dfo eval has no option --no-such-option"
    assert check_command(root, "dfo evaluate --host ct129") == "dfo has no command evaluate"
    assert check_command(root, "dfo runs frobnicate") == "dfo runs has no command frobnicate"
