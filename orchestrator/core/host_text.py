"""Text that came from a host, made safe to show: on the operator's terminal and in Markdown files.

A host (or any job on it) chooses the characters of its error messages, log lines, file, drafter and
checkpoint names and results. On a terminal, control characters are commands: ESC sequences erase or
rewrite lines, retitle the window, write the clipboard (OSC 52) or draw links (OSC 8); a lone CR
overwrites the line it is on. In Markdown, HTML renders (a tracking ``<img>``), ``[x](url)`` becomes a
link or a remote image, a ``|`` or a newline breaks a table row, backticks close a code span or fence.

``clean`` is the terminal filter (the CLI's consoles run everything they write through it:
``orchestrator.ui.safe_console``); ``md_text``, ``md_code`` and ``md_fence`` write host text into Markdown;
``fmt_number`` formats a figure from a host's results, which may be a string, a dict or a huge int;
``whole_number`` checks an integer from a host against its bounds.
No terminal library here: the evaluation and watch code that writes Markdown uses it too.
"""

from __future__ import annotations

import json
import re
from typing import Any

# C0 controls except tab and newline, DEL, C1 controls (U+009B is a one-character CSI for some terminals),
# and the bidi embeddings/overrides/isolates, which reorder how the rest of the line is displayed.
_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Lone surrogates (JSON's "\ud800" decodes to one): no encoder writes them, printing one raises.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_UNCLEAN_RE = re.compile(f"{_CONTROL_RE.pattern}|{_SURROGATE_RE.pattern}")
# Characters that start Markdown syntax inline: escapes, code spans, links/images/references (all open with
# '['), table cells. HTML is written as entities instead.
_MD_PUNCT_RE = re.compile(r"([\\`\[|])")
_BACKTICKS_RE = re.compile("`+")


def decode_json(text: str | bytes) -> Any:
    """``json.loads`` for text a host wrote (replies, pulled results and samples, progress lines, records): any
    decode failure is a ``ValueError``. json raises ``RecursionError`` (not a ValueError) on a deeply nested
    document and ``MemoryError`` on a huge one; the callers' ``except ValueError`` then turns it into a
    clear error naming the host or the file instead of a traceback."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except MemoryError:
        raise ValueError("JSON too large") from None


INT64_MAX = 2**63 - 1  # what files, offsets, os.* calls, struct and event files take; a host's figure past it is bad
PID_MAX = 2**22  # Linux's PID_MAX_LIMIT


def whole_number(value: object, minimum: int = 0, maximum: int = INT64_MAX) -> bool:
    """Whether VALUE, parsed from a host's JSON, is an int (not a bool, not a float) from MINIMUM to MAXIMUM:
    counts, sizes, pids, exit codes and ports are checked against their bounds where they are read."""
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum


def clean(text: object) -> str:
    """TEXT with every control character removed but newline and tab (CRLF becomes LF; a lone CR goes)."""
    s = text if isinstance(text, str) else str(text)
    s = _SURROGATE_RE.sub("\ufffd", s.replace("\r\n", "\n"))
    return _CONTROL_RE.sub("", s)


def is_clean(text: str) -> bool:
    """Whether ``clean`` would leave TEXT as it is (cheaper than cleaning: most text has nothing to remove)."""
    return _UNCLEAN_RE.search(text) is None


def one_line(text: object) -> str:
    """``clean`` TEXT with its runs of whitespace (newlines included) as single spaces."""
    return " ".join(clean(text).split())


def md_text(text: object) -> str:
    """TEXT as one line of inline Markdown that shows as itself, in a paragraph, a list item or a table cell.

    HTML is written as entities; backslash, backticks, '[' and '|' are backslash-escaped, so no tag, link,
    image, code span or extra cell can start, and a leading '#', '-', '+', '*' or '=' is escaped, so no
    heading or list starts. Emphasis characters are left: they change only the look.
    """
    s = one_line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_PUNCT_RE.sub(r"\\\1", s)
    # At the start of a line '#' opens a heading, '-', '+', '*' a list, '=' a setext underline.
    return "\\" + s if s[:1] in ("#", "-", "+", "*", "=") else s


def md_code(text: object, *, in_table: bool = False) -> str:
    """TEXT as an inline code span that it cannot close: the span's backtick run is longer than any inside.

    In a table cell a '|' splits the row even inside a code span unless escaped (GFM unescapes it there).
    """
    s = one_line(text)
    if in_table:
        s = s.replace("|", "\\|")
    ticks = "`" * (1 + max((len(run) for run in _BACKTICKS_RE.findall(s)), default=0))
    pad = " " if not s or s.startswith("`") or s.endswith("`") else ""  # one space each side is stripped again
    return f"{ticks}{pad}{s}{pad}{ticks}"


def md_fence(text: object, info: str = "") -> list[str]:
    """TEXT as the lines of a fenced code block whose fence is longer than any backtick run inside it."""
    body = clean(text)
    fence = "`" * max(3, 1 + max((len(run) for run in _BACKTICKS_RE.findall(body)), default=0))
    return [fence + info, *body.split("\n"), fence]


def fmt_number(value: object, spec: str = ".2f", missing: str = "–") -> str:
    """VALUE formatted with SPEC; MISSING for None, "?" for anything that is not a number (bools included)."""
    if value is None:
        return missing
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "?"
    try:
        return format(value, spec)
    except (OverflowError, ValueError):  # an int too large for a float spec; a spec that does not fit an int
        return "?"
