"""Every relative link and anchor in README.md and docs/*.md resolves.

A link `[text](path)` or `[text](path#anchor)` (or an image) that is not a URL must name a file of the
repository, relative to the page; an anchor must be a heading of the target page as GitHub renders its id
(lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats). Pages other sessions write
(EXPECTED_PAGES) are reported by name when missing, so a merge that lacks one says which.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Pages of this turn's other features, linked from the README's docs list.
EXPECTED_PAGES = ("docs/dflash2.md", "docs/rules-and-protocols.md", "docs/profiles.md", "docs/clusters.md",
                  "docs/watch-proxies.md", "docs/completion-and-checks.md")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line, text) outside fenced blocks, code spans removed (a `[x](y)` in code is not a link)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((n, CODE_SPAN.sub("", line)))
    return out


def anchors(text: str) -> set[str]:
    """The ids GitHub gives the headings of a markdown page."""
    seen: dict[str, int] = {}
    ids = set()
    for _, line in prose_lines(text.replace("`", "")):
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def broken_links(page: Path, text: str) -> list[str]:
    bad = []
    for line, content in prose_lines(text):
        for target in LINK.findall(content):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = f"{page.relative_to(REPO)}:{line}: {target}"
            if not path:
                if anchor not in anchors(text):
                    bad.append(f"{where} (no heading with that anchor)")
                continue
            dest = (page.parent / path).resolve()
            if not dest.exists():
                rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
                why = "an expected page, not merged yet" if rel in EXPECTED_PAGES else "no such file"
                bad.append(f"{where} ({why})")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text(encoding="utf-8"))):
                bad.append(f"{where} (no heading with that anchor)")
    return bad


def test_every_relative_link_and_anchor_resolves():
    bad = [problem for page in doc_files() for problem in broken_links(page, page.read_text(encoding="utf-8"))]
    assert bad == [], "broken links:\n" + "\n".join(bad)


def test_the_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = {(REPO / target.partition("#")[0]).resolve() for target in LINK.findall(readme)}
    pages = {p.resolve() for p in (REPO / "docs").glob("*.md")} | {(REPO / p).resolve() for p in EXPECTED_PAGES}
    missing = sorted(p.relative_to(REPO).as_posix() for p in pages - linked)
    assert missing == [], f"docs pages the README does not link: {missing}"


def test_the_check_catches_what_it_is_for(tmp_path):
    page = REPO / "docs" / "example.md"
    text = ("# A page\n\n## τ at T > 0 (`--temperature T`)\n\n## Two\n## Two\n\n"
            "[ok](#two-1) [ok](#τ-at-t--0---temperature-t) [ok](../README.md) [web](https://example.org/x#y)\n"
            "[bad](#three) [bad](nowhere.md) [bad](architecture.md#no-such-heading) `[code](not-a-link.md)`\n"
            "[later](profiles.md)\n```\n[fenced](also-not-a-link.md)\n```\n")
    assert [p.split(": ", 1)[1] for p in broken_links(page, text)] == [
        "#three (no heading with that anchor)",
        "nowhere.md (no such file)",
        "architecture.md#no-such-heading (no heading with that anchor)",
    ] + ([] if (REPO / "docs/profiles.md").exists() else ["profiles.md (an expected page, not merged yet)"])
