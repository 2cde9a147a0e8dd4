"""Named measurement protocols (``--protocol NAME``): a published card's measurement in one flag. Stdlib only
(the controller imports it).

A protocol fixes the options that make a τ comparable with the card: dataset and N, row selection, the sampling
law, thinking mode, max new tokens and the draft rule. An option left at its default takes the protocol's value;
an option given with another value is refused (one rule, both on the controller and on the host: a figure that
claims a protocol is measured under all of it). An option given with exactly its default value cannot be told
from one not given, so it takes the protocol's value too.
"""

from __future__ import annotations

from typing import Any

from remote_payload.errors import PayloadError

PROTOCOLS: dict[str, dict[str, Any]] = {
    "zlab-card-gsm8k-t1": {
        "source": "z-lab's Qwen3.8-27B-DFlash2 card (GSM8K, 128 prompts, concurrency 1, T = 1, top-p 0.95, top-k 20, "
                  "thinking on, up to 4,096 new tokens; τ 5.46 on the card), measured by its server benchmark path; "
                  "its τ counts as zlab = committed (z-lab's loop since August 2026)",
        "values": {"datasets": ["gsm8k@128"], "selection": "zlab-server", "selection_concurrency": 1,
                   "temperature": 1.0, "top_p": 0.95, "top_k": 20, "enable_thinking": True,
                   "max_new_tokens": 4096, "draft_rule": "sampled"},
    },
}
FLAGS = {"datasets": "--dataset", "prompts": "--prompts", "samples": "--samples",
         "selection": "--selection", "selection_concurrency": "--selection-concurrency",
         "temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k",
         "enable_thinking": "--enable-thinking", "max_new_tokens": "--max-new-tokens", "draft_rule": "--draft-rule"}


def preset(name: str) -> dict[str, Any]:
    if name not in PROTOCOLS:
        raise PayloadError(f"--protocol {name}: unknown; known: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]["values"]


def fill(values: dict[str, Any], defaults: dict[str, Any], name: str | None) -> dict[str, Any]:
    """``values`` (by field) with every protocol field that is at its default set to the protocol's value."""
    return fill_from(values, defaults, preset(name)) if name else values


def fill_from(values: dict[str, Any], defaults: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every field of ``fixed`` that is at its default set to ``fixed``'s value (a protocol's, a
    card's)."""
    out = dict(values)
    for field, value in fixed.items():
        if out.get(field) in (None, [], defaults.get(field)):
            out[field] = value
    return out


def conflicts(values: dict[str, Any], name: str | None) -> list[str]:
    """The options whose value differs from the protocol's ("--temperature 0.6 (the protocol: 1)")."""
    return clashes(values, preset(name), "the protocol") if name else []


def clashes(values: dict[str, Any], fixed: dict[str, Any], owner: str) -> list[str]:
    """The options whose value differs from ``fixed``'s ("--temperature 0.6 (OWNER: 1)")."""
    out = []
    for field, want in fixed.items():
        got = values.get(field)
        if isinstance(want, float) and isinstance(got, (int, float)):
            same = float(got) == want
        else:
            same = got == want
        if not same:
            out.append(f"{FLAGS[field]} {_show(got)} ({owner}: {_show(want)})")
    return out


def record(name: str) -> dict[str, Any]:
    """``settings.protocol`` in results.json."""
    p = PROTOCOLS[name]
    return {"name": name, "source": p["source"], "values": dict(p["values"])}


def _show(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)
