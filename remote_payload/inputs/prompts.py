"""Prompt sets: the bundled built-in set, or a user JSONL file of {"id", "messages" | "prompt"}; the benchmark
datasets (``datasets/``) give the same ``Prompt``s."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

from remote_payload.errors import PayloadError

BUILTIN = Path(__file__).resolve().parents[1] / "data" / "prompts.jsonl"
ROLES = {"system", "user", "assistant"}


@dataclass(frozen=True)
class Prompt:
    index: int  # position in the full prompt set (stable across shards, used to merge)
    id: str
    messages: tuple[tuple[str, str], ...]
    category: str | None = None
    dataset: str | None = None  # the benchmark dataset it comes from (None: a prompt set)
    row_id: str | None = None   # the dataset row's id
    turn: int | None = None     # 1, 2, … in a multi-turn row (None: a single-turn prompt)
    follows: int | None = None  # index of the turn before this one: its answer goes into this turn's history
    thinking: bool | None = None  # its chat template's thinking mode (None: the run's --enable-thinking)
    paired: int | None = None   # --enable-thinking both: the index the prompt had before the two modes were made
    depth: int | None = None    # a longctx prompt: the exact prompt length in target tokens it is built to
    context: str | None = None  # a longctx prompt before it is built: the text its context is cut from

    def message_dicts(self) -> list[dict]:
        return [{"role": r, "content": c} for r, c in self.messages]

    @property
    def conversation(self) -> str:
        """Turns of one row share it: they are evaluated in order, on one host."""
        return f"{self.dataset}/{self.row_id}" if self.dataset is not None else self.id


def with_history(prompt: Prompt, previous: Prompt, answer: str) -> Prompt:
    """A later turn as it is asked: the previous turn's messages, its answer, then this turn's user message
    (z-lab's benchmark appends the decoded output of each turn the same way)."""
    return replace(prompt, messages=previous.messages + (("assistant", answer),) + prompt.messages[-1:])


def _parse_line(source: str, lineno: int, line: str, index: int) -> Prompt:
    where = f"{source} line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"prompts {where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise PayloadError(f"prompts {where}: expected an object with \"id\" and \"messages\" or \"prompt\"")
    pid = obj.get("id", f"prompt-{index}")
    if not isinstance(pid, (str, int)):
        raise PayloadError(f"prompts {where}: \"id\" must be a string")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise PayloadError(f"prompts {where}: \"messages\" must be a non-empty list")
        parsed = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise PayloadError(f"prompts {where}: messages[{i}] must be {{\"role\": system|user|assistant, "
                                   f"\"content\": string}}, found {json.dumps(m)[:80]}")
            parsed.append((m["role"], m["content"]))
        messages = tuple(parsed)
    elif isinstance(obj.get("prompt"), str):
        messages = (("user", obj["prompt"]),)
    else:
        raise PayloadError(f"prompts {where}: needs \"messages\" (list) or \"prompt\" (string); "
                           f"keys found: {', '.join(sorted(obj)) or 'none'}")
    cat = obj.get("category")
    return Prompt(index=index, id=str(pid), messages=messages, category=cat if isinstance(cat, str) else None)


def load_prompts(source: str) -> tuple[list[Prompt], dict]:
    """Load a prompt set; returns the prompts and a description for the results (source, digest)."""
    path = BUILTIN if source == "builtin" else Path(source)
    if not path.is_file():
        raise PayloadError(f"prompts file {path} not found (use --prompts builtin or a JSONL file)")
    raw = path.read_bytes()
    prompts: list[Prompt] = []
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if line.strip():
            prompts.append(_parse_line(str(path), lineno, line, len(prompts)))
    if not prompts:
        raise PayloadError(f"prompts file {path} holds no prompts")
    ids = [p.id for p in prompts]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise PayloadError(f"prompts file {path}: duplicate id(s) {', '.join(dupes[:5])}")
    return prompts, {"source": source, "path": str(path), "sha256": hashlib.sha256(raw).hexdigest(),
                     "count": len(prompts)}


def parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise PayloadError(f"--shard must look like I/N (e.g. 0/4), not {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise PayloadError(f"--shard {text}: need 0 <= I < N")
    return i, n


def select(prompts: list[Prompt], samples: int | None, shard: tuple[int, int]) -> list[Prompt]:
    """First ``samples`` prompts of the set, then every N-th conversation from I (so shards of one job partition
    it; the turns of one dataset row stay together, in order, on one host)."""
    chosen = prompts if samples is None else prompts[:samples]
    i, n = shard
    order = list(dict.fromkeys(p.conversation for p in chosen))
    mine = set(order[i::n])
    return [p for p in chosen if p.conversation in mine]


def conversations(prompts: list[Prompt]) -> int:
    """How many units a shard can take (a multi-turn row is one)."""
    return len({p.conversation for p in prompts})
