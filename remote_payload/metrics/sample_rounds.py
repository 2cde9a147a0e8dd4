"""Round lists as stored per sample in samples.jsonl, and read back into ``chain.Round``. Pure stdlib.

Every per-sample acceptance record (the chain one at ``line["drafters"][name]`` and the tree ones at
``line["drafters"][name]["tree"]["topk" | "budgeted"]``) stores its rounds as three parallel lists:
``anchors`` (absolute position of each round's anchor), ``accepted`` (drafts accepted) and ``produced``
(τ_round), plus ``tau`` (the sample's mean τ_round, null without rounds) and ``rounds``. ``remaining`` is
not stored: it follows from the sample's token counts (prompt_tokens + continuation_tokens − 1 − anchor).

Reading checks that the lists describe a complete replay (first anchor = prompt length, each anchor =
previous anchor + produced, produced = min(accepted + 1, remaining), the last round ends on the last
token), so a merged or compared result is never computed from a truncated or hand-edited line.
"""

from __future__ import annotations

from typing import Sequence

from remote_payload.errors import PayloadError
from remote_payload.metrics.chain import Round, sample_tau


def entry_from_rounds(rounds: Sequence[Round]) -> dict:
    return {"tau": sample_tau(rounds), "rounds": len(rounds), "anchors": [r.anchor for r in rounds],
            "accepted": [r.accepted for r in rounds], "produced": [r.produced for r in rounds]}


def rounds_from_entry(entry: dict, prompt_tokens: int, continuation_tokens: int, where: str) -> list[Round]:
    """Rebuild the Rounds of one stored record; ``where`` names it in errors (sample id, drafter, kind)."""
    try:
        anchors, accepted, produced = (list(entry[key]) for key in ("anchors", "accepted", "produced"))
    except (KeyError, TypeError):
        found = ", ".join(sorted(entry)) if isinstance(entry, dict) else type(entry).__name__
        raise PayloadError(f"{where}: needs the lists 'anchors', 'accepted' and 'produced' (found: {found})") from None
    if not len(anchors) == len(accepted) == len(produced):
        raise PayloadError(f"{where}: 'anchors', 'accepted', 'produced' have different lengths "
                           f"({len(anchors)}, {len(accepted)}, {len(produced)})")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (*anchors, *accepted, *produced)):
        raise PayloadError(f"{where}: 'anchors', 'accepted', 'produced' must hold integers")
    last = prompt_tokens + continuation_tokens - 1
    rounds = []
    expected_anchor = prompt_tokens
    for i, (a, acc, prod) in enumerate(zip(anchors, accepted, produced, strict=False)):
        remaining = last - a
        if a != expected_anchor or remaining < 1 or not 0 <= acc <= remaining or prod != min(acc + 1, remaining):
            raise PayloadError(
                f"{where}: round {i} (anchor {a}, accepted {acc}, produced {prod}) does not continue a replay "
                f"over {prompt_tokens} prompt + {continuation_tokens} continuation tokens (expected anchor "
                f"{expected_anchor}, produced = min(accepted + 1, {remaining}))")
        rounds.append(Round(a, acc, prod, remaining))
        expected_anchor = a + prod
    if expected_anchor < last:
        raise PayloadError(f"{where}: the rounds stop at position {expected_anchor}, before the last token "
                           f"({last}): the record is truncated")
    return rounds
