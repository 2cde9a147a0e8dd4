"""A published card as data: the figure and the protocol that produced it (``--card NAME|FILE``). Stdlib only:
the controller checks a card file with this schema before anything connects, the payload reads the same file.

A card file is YAML (or JSON) with the keys of docs/cards.md. Any protocol field, and the count and the
aggregation, may be ``unknown``: cards often leave out the thinking mode or the count, and ``--explain`` then
measures both sides. Every value is checked here, so a bad card is refused naming its file and field.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from remote_payload.errors import PayloadError

UNKNOWN = "unknown"
INLINE = "given inline"  # where a card given as its JSON document comes from
COUNTS = ("committed", "zlab", "zlab-2604", "vllm")  # zlab = committed (z-lab's loop since August 2026)
AGGREGATIONS = ("per_request", "token_weighted", "pooled")
SELECTIONS = ("transformers", "server", "file")
CHAT_TEMPLATES = ("target", "drafter")
DRAFT_RULES = ("sampled", "greedy")
ENGINE_NAMES = ("vllm", "sglang")  # an engine@VERSION figure; "offline" is a harness without a serving engine
SHIPPED = Path(__file__).resolve().parent / "data"
TOP_KEYS = ("card", "source", "target", "drafter", "figure", "count", "aggregation", "protocol", "notes")
PROTOCOL_KEYS = ("dataset", "n", "selection", "thinking", "reasoning_effort", "chat_template", "temperature",
                 "top_p", "top_k", "draft_rule", "k", "max_new_tokens", "engine", "selection_concurrency")
REQUIRED_PROTOCOL = ("dataset", "n")  # what makes a measurement at all; every other field may be unknown


@dataclass(frozen=True)
class Model:
    name: str
    digest: str | None = None


@dataclass(frozen=True)
class Figure:
    tau: float
    ci: tuple[float, float] | None = None
    n: int | None = None


@dataclass(frozen=True)
class Protocol:
    """Every field: its value, or ``unknown``. ``dataset`` is a benchmark dataset name or a prompts file."""

    dataset: str
    n: int
    selection: str = UNKNOWN
    thinking: Any = UNKNOWN            # True, False or unknown
    reasoning_effort: str | None = None
    chat_template: str = UNKNOWN
    temperature: Any = UNKNOWN
    top_p: Any = UNKNOWN
    top_k: Any = UNKNOWN
    draft_rule: str = UNKNOWN
    k: Any = UNKNOWN                   # drafts per step
    max_new_tokens: Any = UNKNOWN
    engine: str = UNKNOWN              # offline | vllm@VERSION | sglang@VERSION | unknown
    selection_concurrency: int = 1     # the server path's warm-up rows (z-lab's --concurrency)

    def unknown(self) -> list[str]:
        return [k for k, v in asdict(self).items() if v == UNKNOWN]


@dataclass(frozen=True)
class Card:
    card: str
    source: str
    target: Model
    drafter: Model
    figure: Figure
    count: str
    aggregation: str
    protocol: Protocol
    where: str = ""                    # the file it came from (or "shipped card NAME")
    notes: str | None = None
    extra: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        """The card as a document ``parse_card`` reads back (what the controller sends the payload)."""
        out = asdict(self)
        out.pop("extra")
        out.pop("where")
        if out["notes"] is None:
            out.pop("notes")
        out["figure"]["ci"] = list(self.figure.ci) if self.figure.ci else None
        out["protocol"]["thinking"] = _on_off(self.protocol.thinking)
        for key in ("target", "drafter"):
            if out[key]["digest"] is None:
                out[key].pop("digest")
        if out["protocol"]["reasoning_effort"] is None:
            out["protocol"].pop("reasoning_effort")
        return out

    def text(self) -> str:
        """One line: the document itself, compact (``--card`` takes it as its value)."""
        return json.dumps(self.as_json(), separators=(",", ":"), ensure_ascii=False)


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def load_card(spec: str) -> Card:
    """A shipped card by name, a card file (YAML/JSON), or a card document itself (JSON, as the controller sends
    it); refused naming the file and the field."""
    if spec.lstrip().startswith("{"):
        return parse_card(read_document(spec, INLINE), INLINE)
    path = Path(spec)
    if spec in shipped_names():
        path = SHIPPED / f"{spec}.yaml"
    elif not path.is_file():
        raise PayloadError(f"--card {spec}: neither a shipped card ({', '.join(shipped_names())}) nor a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PayloadError(f"card {path}: cannot read it ({exc})") from None
    return parse_card(read_document(text, str(path)), str(path))


def read_document(text: str, where: str) -> Any:
    """JSON, else YAML (PyYAML where installed, as on every payload host; else ruamel.yaml, the controller's)."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise PayloadError(f"card {where}: not valid JSON ({exc})") from None
    try:
        import yaml
    except ImportError:
        from ruamel.yaml import YAML
        from ruamel.yaml.error import YAMLError

        try:
            return YAML(typ="safe", pure=True).load(text)
        except YAMLError as exc:
            raise PayloadError(f"card {where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PayloadError(f"card {where}: not valid YAML ({str(exc).splitlines()[0]})") from None


def parse_card(data: Any, where: str) -> Card:
    if not isinstance(data, dict):
        raise PayloadError(f"card {where}: expected a mapping of {', '.join(TOP_KEYS[:8])}")
    _no_other_keys(data, TOP_KEYS, where, "")
    name = _text(data, "card", where)
    if not all(c.isalnum() or c in "-_." for c in name):
        raise PayloadError(f"card {where}: field card: {name!r} may hold letters, digits, '-', '_' and '.' only")
    proto = data.get("protocol")
    if not isinstance(proto, dict):
        raise PayloadError(f"card {where}: field protocol: expected a mapping ({', '.join(PROTOCOL_KEYS[:13])})")
    return Card(card=name, source=_text(data, "source", where), target=_model(data, "target", where),
                drafter=_model(data, "drafter", where), figure=_figure(data, where),
                count=_choice(data, "count", COUNTS, where, unknown=True),
                aggregation=_choice(data, "aggregation", AGGREGATIONS, where, unknown=True),
                protocol=_protocol(proto, where), where=where,
                notes=_text(data, "notes", where) if data.get("notes") is not None else None)


def _protocol(p: dict, where: str) -> Protocol:
    _no_other_keys(p, PROTOCOL_KEYS, where, "protocol.")
    for key in REQUIRED_PROTOCOL:
        if p.get(key) in (None, UNKNOWN):
            raise PayloadError(f"card {where}: field protocol.{key}: required (what was measured)")
    n = _number(p, "n", where, int, least=1, prefix="protocol.")
    thinking = p.get("thinking", UNKNOWN)
    thinking = {"on": True, "off": False}.get(thinking, thinking) if isinstance(thinking, str) else thinking
    if thinking is None or thinking not in (True, False, UNKNOWN):
        raise PayloadError(f"card {where}: field protocol.thinking: expected on, off or unknown, got {thinking!r}")
    effort = p.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise PayloadError(f"card {where}: field protocol.reasoning_effort: expected a word, got {effort!r}")
    engine = p.get("engine", UNKNOWN)
    if not isinstance(engine, str) or not (engine in ("offline", UNKNOWN) or _engine_ok(engine)):
        raise PayloadError(f"card {where}: field protocol.engine: expected offline, "
                           f"{' | '.join(e + '@VERSION' for e in ENGINE_NAMES)} or unknown, got {engine!r}")
    out = Protocol(
        dataset=_text(p, "dataset", where, prefix="protocol."), n=int(n),
        selection=_choice(p, "selection", SELECTIONS, where, unknown=True, prefix="protocol."),
        thinking=thinking, reasoning_effort=effort,
        chat_template=_choice(p, "chat_template", CHAT_TEMPLATES, where, unknown=True, prefix="protocol."),
        temperature=_maybe_number(p, "temperature", where, float, least=0.0),
        top_p=_maybe_number(p, "top_p", where, float, least=0.0, most=1.0, above=True),
        top_k=_maybe_number(p, "top_k", where, int, least=0),
        draft_rule=_choice(p, "draft_rule", DRAFT_RULES, where, unknown=True, prefix="protocol."),
        k=_maybe_number(p, "k", where, int, least=1),
        max_new_tokens=_maybe_number(p, "max_new_tokens", where, int, least=1),
        engine=engine,
        selection_concurrency=int(_number(p, "selection_concurrency", where, int, least=1, prefix="protocol.",
                                          default=1)))
    from remote_payload.inputs.datasets.registry import ADAPTERS

    if not (_is_prompts_file(out.dataset) or out.dataset in ADAPTERS):
        raise PayloadError(f"card {where}: field protocol.dataset: {out.dataset!r} is neither a benchmark dataset "
                           f"({', '.join(ADAPTERS)}) nor a prompts file (builtin, or a .jsonl file)")
    if _is_prompts_file(out.dataset) and out.selection not in ("file", UNKNOWN):
        raise PayloadError(f"card {where}: field protocol.selection: a prompts file is measured in file order: give "
                           f"file (or unknown), not {out.selection!r}")
    if out.selection == "file" and not _is_prompts_file(out.dataset):
        raise PayloadError(f"card {where}: field protocol.selection: 'file' (every row in file order) is for a "
                           f"prompts file (builtin or a .jsonl file), not the benchmark dataset {out.dataset!r}: give "
                           "transformers or server (z-lab's two paths)")
    return out


def is_prompts_file(card: Card) -> bool:
    return _is_prompts_file(card.protocol.dataset)


def _is_prompts_file(dataset: str) -> bool:
    return dataset == "builtin" or dataset.endswith(".jsonl")


def _engine_ok(text: str) -> bool:
    name, sep, version = text.partition("@")
    return name in ENGINE_NAMES and (not sep or bool(version.strip()))


def _on_off(value: Any) -> Any:
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def _no_other_keys(data: dict, known: tuple[str, ...], where: str, prefix: str) -> None:
    other = [str(k) for k in data if k not in known]
    if other:
        raise PayloadError(f"card {where}: field {prefix}{other[0]}: not a card field (known: {', '.join(known)})")


def _text(data: dict, key: str, where: str, prefix: str = "") -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PayloadError(f"card {where}: field {prefix}{key}: expected a non-empty text, got {value!r}")
    return value.strip()


def _model(data: dict, key: str, where: str) -> Model:
    value = data.get(key)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"].strip():
        raise PayloadError(f"card {where}: field {key}: expected {{name: ..., digest: ... (optional)}}, got {value!r}")
    _no_other_keys(value, ("name", "digest"), where, f"{key}.")
    digest = value.get("digest")
    if digest is not None and not isinstance(digest, str):
        raise PayloadError(f"card {where}: field {key}.digest: expected a text (sha256), got {digest!r}")
    return Model(value["name"].strip(), digest)


def _figure(data: dict, where: str) -> Figure:
    fig = data.get("figure")
    if not isinstance(fig, dict):
        raise PayloadError(f"card {where}: field figure: expected {{tau: X, ci: [lo, hi] or null, n: N or null}}")
    _no_other_keys(fig, ("tau", "ci", "n"), where, "figure.")
    tau = _number(fig, "tau", where, float, least=1.0, prefix="figure.")
    ci = fig.get("ci")
    if ci is not None:
        if (not isinstance(ci, list) or len(ci) != 2 or not all(_real(v) for v in ci)
                or not float(ci[0]) <= tau <= float(ci[1])):
            raise PayloadError(f"card {where}: field figure.ci: expected [lo, hi] around tau {tau:g} or null, "
                               f"got {ci!r}")
        ci = (float(ci[0]), float(ci[1]))
    n = fig.get("n")
    if n is not None:
        n = int(_number(fig, "n", where, int, least=1, prefix="figure."))
    return Figure(float(tau), ci, n)


def _choice(data: dict, key: str, choices: tuple[str, ...], where: str, *, unknown: bool = False,
            prefix: str = "") -> str:
    value = data.get(key, UNKNOWN if unknown else None)
    allowed = (*choices, UNKNOWN) if unknown else choices
    if value not in allowed:
        raise PayloadError(f"card {where}: field {prefix}{key}: expected {' | '.join(allowed)}, got {value!r}")
    return str(value)


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(data: dict, key: str, where: str, kind: type, *, least: float | None = None, most: float | None = None,
            above: bool = False, prefix: str = "", default: Any = None) -> float:
    value = data.get(key, default)
    ok = _real(value) and (kind is float or float(value).is_integer())
    if ok and least is not None:
        ok = value > least if above else value >= least
    if ok and most is not None:
        ok = value <= most
    if not ok:
        what = "a whole number" if kind is int else "a number"
        bounds = ((f" above {least:g}" if above else f" of at least {least:g}") if least is not None else "") + \
                 (f" and at most {most:g}" if most is not None else "")
        raise PayloadError(f"card {where}: field {prefix}{key}: expected {what}{bounds}, got {value!r}")
    return value


def _maybe_number(p: dict, key: str, where: str, kind: type, **bounds: Any) -> Any:
    if p.get(key, UNKNOWN) == UNKNOWN:
        return UNKNOWN
    value = _number(p, key, where, kind, prefix="protocol.", **bounds)
    return int(value) if kind is int else float(value)
