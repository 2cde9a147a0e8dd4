"""Sizes, durations and rates for people: the one formatter and the one rate parser every command uses.

Sizes print in binary units, as du -h and ls -lh; rates parse as rsync's --bwlimit (K = KiB, KB = 1000).
"""

from __future__ import annotations

import re

from orchestrator.core.errors import InputError

_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4}
# As rsync's suffixes: 50M, 20MiB/s (1024-based), 800KB (1000-based), 50000B (bytes); '/s' may follow.
_RATE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?:(?P<unit>[KMGT])(?P<suffix>I?B)?|(?P<bytes>B))?(?:/S)?",
                   re.IGNORECASE)
RATE_HELP = ("per second, with a unit as rsync's: 800K, 50M, 1.5G (K = KiB, M = MiB, G = GiB), 800KB (1000-based) "
             "or 50000B (bytes); a bare number is refused (rsync reads it as KiB/s, dfo once read bytes/s).")


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None (unknown) -> '?'."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_duration(seconds: float | None) -> str:
    """45 -> '45s', 725 -> '12m05s', 12000 -> '3h20m'; None (unknown) -> '?'."""
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def parse_rate(text: str | None, option: str = "--bwlimit") -> float | None:
    """'50M' -> 52428800.0 bytes per second; None or '' -> None (no limit).

    A bare number is refused: rsync reads ``--bwlimit 50000`` as KiB/s, dfo used to read it as bytes/s,
    and a guess either way is off by 1024.
    """
    if text is None or text.strip() == "":
        return None
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise InputError(f"{option} {text!r}: expected a rate like 800K, 50M or 1.5G (per second)",
                         hint="units as rsync's: K = KiB/s, M = MiB/s, G = GiB/s (KB, MB, GB: 1000-based); "
                         "B for bytes/s")
    if not match["unit"] and not match["bytes"]:
        raise InputError(f"{option} {text!r}: a bare number is ambiguous (rsync reads KiB/s, bytes/s elsewhere)",
                         hint=f"say which: {option} {match['number']}K (KiB/s, rsync's meaning) or "
                         f"{option} {match['number']}B (bytes/s)")
    base = 1000 if (match["suffix"] or "").upper() == "B" else 1024
    value = float(match["number"]) * base ** _POWERS.get((match["unit"] or "").upper(), 0)
    if value <= 0:
        raise InputError(f"{option} {text!r}: must be more than 0", hint="leave the option out for no limit")
    return value
