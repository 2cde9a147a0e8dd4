"""``longctx``: prompts built to chosen depths, so a drafter's τ at 4k, 16k or 64k tokens of context is one flag.

``--dataset longctx:4k,16k,64k[@N]`` (or ``longctx@4k,16k``: depths after the @ when they are not one plain
count). Each depth (``Nk`` = N × 1024 tokens, or a plain token count) gets N prompts, one per source row (every row
without @N, else z-lab's selection of N rows): the row's question after a context made of the other rows' text, in
file order from the row after it, repeated as often as the depth needs. The source is dfo's built-in prompts
(``remote_payload/data/prompts.jsonl``), or a user's JSONL of ``{"id", "messages" | "prompt"}``
(``--dataset-file longctx=PATH``; longer, varied text makes a context that is less repetitive: HumanEval's file, which
the datasets extra ships, has the shape too, ``task_id`` and ``prompt``).

The depth is reached exactly in the target's tokens: on the eval host, with the target's tokenizer and chat template
under the prompt's thinking mode, the context is cut to the longest word prefix whose rendered prompt is at most the
depth, then one-token pieces are appended until it is exactly the depth (``fit``). Deterministic: the same source,
tokenizer and mode give the same prompt. The rounds then start at that depth, so ``by_context_depth`` bins them
there; each prompt's category is its depth, so ``by_dataset.longctx.by_category`` has τ per depth with its CI.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from remote_payload.errors import PayloadError
from remote_payload.inputs.datasets.adapter import Adapter
from remote_payload.inputs.prompts import Prompt

NAME = "longctx"
DEFAULT_DEPTHS = (4096, 16384, 65536)
MAX_DEPTH = 1 << 20
HEADER = "Read the following material; a question about it comes at the end.\n\n"
QUESTION = "\n\nQuestion: "
CONSTRUCTION = ("per depth and source row: the row's question after the other rows' text (file order from the next "
                "row, repeated), cut to the longest word prefix whose chat-templated prompt is at most the depth in "
                "the target's tokens, then padded one token at a time to exactly the depth")
PADS = (" .", "\n", " ,", " -", " a", " 0")  # appended one at a time to reach the depth exactly


def _turns(row: dict) -> list[str]:
    if isinstance(row.get("prompt"), str):
        return [row["prompt"]]
    return [m["content"] for m in row["messages"] if isinstance(m, dict) and m.get("role") == "user"][:1]


ADAPTER = Adapter(
    name=NAME, hub_id="dfo long-context prompts", config=None, split="all", splits=("all",),
    fields=("id", "messages"), alternatives=(("id", "prompt"), ("task_id", "prompt")), turns=_turns,
    row_id=lambda row, i: str(row["id"] if "id" in row else row["task_id"]), zlab_samples=0,
    bundled="data/prompts.jsonl",
)


def parse_depths(text: str, where: str) -> tuple[int, ...]:
    """``4k,16k,64k`` or ``4096,16384`` -> token counts, each once, lowest first."""
    out = []
    for part in text.split(","):
        p = part.strip().lower()
        scale = 1024 if p.endswith("k") else 1
        digits = p[:-1] if scale > 1 else p
        if not (digits.isascii() and digits.isdigit()) or not 16 <= int(digits) * scale <= MAX_DEPTH:
            raise PayloadError(f"{where}: depth {part!r} is not a token count from 16 to {MAX_DEPTH} (e.g. 4k = 4096, "
                               "16k, 64k or 3000)")
        out.append(int(digits) * scale)
    if len(set(out)) != len(out):
        raise PayloadError(f"{where}: a depth is given twice")
    return tuple(sorted(out))


def depth_label(depth: int) -> str:
    return f"{depth // 1024}k" if depth % 1024 == 0 else str(depth)


def prompts_of(rows: list[dict], chosen: list[int], ids: list[str], depths: tuple[int, ...], start: int,
               where: Callable[[int], str]) -> list[Prompt]:
    """One prompt per (depth, chosen row): the row's question, its depth and the context text it is cut from."""
    texts = [ADAPTER.user_turns(row, where(i))[0] for i, row in enumerate(rows)]
    out: list[Prompt] = []
    for depth in depths:
        for pos in chosen:
            others = [texts[(pos + k) % len(texts)] for k in range(1, len(texts))] or [texts[pos]]
            out.append(Prompt(index=start + len(out), id=f"{NAME}/{ids[pos]}@{depth_label(depth)}",
                              messages=(("user", texts[pos]),), category=depth_label(depth), dataset=NAME,
                              row_id=f"{ids[pos]}@{depth_label(depth)}", depth=depth, context="\n\n".join(others)))
    return out


def fit(prompt: Prompt, render: Callable[[list[dict]], list[int]]) -> Prompt:
    """The prompt with its context cut and padded so that ``render`` (the target's chat template and tokenizer under
    the prompt's thinking mode) gives exactly ``prompt.depth`` tokens."""
    depth, question = prompt.depth, prompt.messages[-1][1]
    assert depth is not None and prompt.context is not None
    words = prompt.context.split(" ")

    def text(n: int, pad: str = "") -> str:
        return HEADER + " ".join(words[i % len(words)] for i in range(n)) + pad + QUESTION + question

    def length(t: str) -> int:
        return len(render([{"role": "user", "content": t}]))

    if length(text(0)) > depth:
        raise PayloadError(f"{prompt.id}: the question and the chat template alone are {length(text(0))} tokens, "
                           f"longer than the depth {depth}: choose a deeper depth or shorter questions")
    lo, hi = 0, depth  # every word is at least one token: depth words reach the depth
    while lo < hi:  # the most words whose prompt is at most the depth
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if length(text(mid)) <= depth else (lo, mid - 1)
    for n in range(lo, max(-1, lo - 8), -1):  # pad one token at a time; a BPE merge may need a word fewer
        pad = ""
        while (have := length(text(n, pad))) < depth:
            step = next((p for p in PADS if length(text(n, pad + p)) == have + 1), None)
            if step is None:
                break
            pad += step
        if length(text(n, pad)) == depth:
            return replace(prompt, messages=prompt.messages[:-1] + (("user", text(n, pad)),), context=None)
    raise PayloadError(f"{prompt.id}: could not build a prompt of exactly {depth} tokens with this tokenizer")
