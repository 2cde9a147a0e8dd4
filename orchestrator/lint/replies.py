"""The lint host script's answers, typed on arrival: whatever a host sent is data, so each field is checked here and
a wrong type is a HostError naming the host and the field (config documents stay plain JSON data: the rules read
them defensively)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

from orchestrator.core.errors import HostError

TEXT_MAX = 400  # a name, an error or a piece from a host, at most this long where it is shown


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str | None = None  # of its data bytes (--deep)


@dataclass
class WeightsFile:
    name: str
    size: int | None
    error: str | None
    tensors: dict[str, Tensor] = field(default_factory=dict)
    dtypes: dict[str, int] = field(default_factory=dict)  # every tensor of the file, by dtype
    metadata: dict | None = None


def all_tensors(files: list[WeightsFile]) -> dict[str, Tensor]:
    """Every tensor of FILES by name (a sharded checkpoint's shards together)."""
    out: dict[str, Tensor] = {}
    for f in files:
        out.update(f.tensors)
    return out


@dataclass
class JsonDoc:
    data: Any = None
    error: str | None = None


@dataclass
class DrafterFacts:
    where: str
    kind: str                       # "folder" | "file" (one .safetensors in its folder) | "torch"
    json: dict[str, JsonDoc]        # config.json, dfo-source.json, the index, spec.json (torch: the sidecars)
    files: list[WeightsFile] = field(default_factory=list)
    torch_files: list[str] = field(default_factory=list)
    torch_size: int | None = None
    torch_zip: bool | None = None

    def doc(self, name: str) -> Any:
        d = self.json.get(name)
        return d.data if d is not None else None

    def tensors(self) -> dict[str, Tensor]:
        return all_tensors(self.files)


@dataclass
class TokenizerFacts:
    vocab_size: int | None = None               # tokens of tokenizer.json's model vocabulary
    regular: dict[int, str] = field(default_factory=dict)  # probed ids that are regular vocabulary tokens
    added: dict[int, tuple[str, bool]] = field(default_factory=dict)  # id -> (content, special)
    special_tokens: dict[str, str] = field(default_factory=dict)  # eos_token, pad_token, ... -> content
    chat_template_sha256: str | None = None
    generation_eos: list[int] = field(default_factory=list)
    error: str | None = None


@dataclass
class TargetFacts:
    where: str
    config: JsonDoc | None
    tokenizer: TokenizerFacts
    files: list[WeightsFile] = field(default_factory=list)

    def tensors(self) -> dict[str, Tensor]:
        return all_tensors(self.files)


def _int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _text(x: Any) -> str:
    return str(x)[:TEXT_MAX]


def _bad(host: str, what: str, value: Any) -> HostError:
    return HostError(host, f"lint: the host's answer has a malformed {what}: {str(value)[:200]}")


def _doc(host: str, name: str, raw: Any) -> JsonDoc:
    if not isinstance(raw, dict):
        raise _bad(host, f"{name} entry", raw)
    return JsonDoc(data=raw.get("data"), error=_text(raw["error"]) if raw.get("error") is not None else None)


def _file(host: str, raw: Any) -> WeightsFile:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise _bad(host, "weights file", raw)
    size = raw.get("size")
    out = WeightsFile(_text(raw["name"]), size if _int(size) and size >= 0 else None,
                      _text(raw["error"]) if raw.get("error") is not None else None)
    if out.error is not None:
        return out
    tensors = raw.get("tensors")
    dtypes = raw.get("dtypes")
    if not isinstance(tensors, dict) or not isinstance(dtypes, dict):
        raise _bad(host, f"header of {out.name}", raw)
    for name, t in tensors.items():
        shape = t.get("shape") if isinstance(t, dict) else None
        if not isinstance(shape, list) or not all(_int(d) and d >= 0 for d in shape):
            raise _bad(host, f"shape of {name!r} in {out.name}", t)
        sha = t.get("sha256")
        out.tensors[_text(name)] = Tensor(_text(name), _text(t.get("dtype")), tuple(shape),
                                          sha if isinstance(sha, str) and len(sha) == 64 else None)
    out.dtypes = {_text(k): v for k, v in dtypes.items() if _int(v)}
    meta = raw.get("metadata")
    out.metadata = meta if isinstance(meta, dict) else None
    return out


def drafter_facts(host: str, where: str, raw: Any) -> DrafterFacts | None:
    """The drafter's facts, or None when the path does not exist there."""
    if not isinstance(raw, dict):
        raise _bad(host, "reply", raw)
    if raw.get("missing"):
        return None
    kind = raw.get("kind")
    docs = raw.get("json")
    if kind not in ("folder", "file", "torch") or not isinstance(docs, dict):
        raise _bad(host, "reply", raw)
    out = DrafterFacts(where, kind, {_text(k): _doc(host, k, v) for k, v in docs.items()})
    if kind == "torch":
        size = raw.get("size")
        out.torch_size = size if _int(size) else None
        out.torch_zip = bool(raw.get("zip"))
        return out
    files, torch_files = raw.get("files"), raw.get("torch_files")
    if not isinstance(files, list) or not isinstance(torch_files, list):
        raise _bad(host, "reply", raw)
    out.files = [_file(host, f) for f in files]
    out.torch_files = [_text(n) for n in torch_files if isinstance(n, str)]
    return out


def _tokenizer(host: str, raw: Any) -> TokenizerFacts:
    if not isinstance(raw, dict):
        raise _bad(host, "tokenizer facts", raw)
    out = TokenizerFacts()
    if _int(raw.get("vocab_size")):
        out.vocab_size = raw["vocab_size"]
    for k, v in (raw.get("regular") or {}).items():
        if str(k).isdigit():
            out.regular[int(k)] = _text(v)
    for a in raw.get("added") or []:
        if isinstance(a, dict) and _int(a.get("id")):
            out.added[a["id"]] = (_text(a.get("content")), bool(a.get("special")))
    specials = raw.get("special_tokens")
    if isinstance(specials, dict):
        out.special_tokens = {_text(k): _text(v) for k, v in specials.items() if isinstance(v, str)}
    sha = raw.get("chat_template_sha256")
    out.chat_template_sha256 = sha if isinstance(sha, str) and len(sha) == 64 else None
    eos = raw.get("generation_eos")
    out.generation_eos = [e for e in (eos if isinstance(eos, list) else [eos]) if _int(e)]
    if raw.get("tokenizer_json_error") is not None:
        out.error = _text(raw["tokenizer_json_error"])
    return out


def target_facts(host: str, where: str, raw: Any) -> TargetFacts | None:
    """The target's facts, or None when the folder does not exist there."""
    if not isinstance(raw, dict):
        raise _bad(host, "reply", raw)
    if raw.get("missing"):
        return None
    files = raw.get("files")
    if not isinstance(files, list):
        raise _bad(host, "reply", raw)
    config = _doc(host, "config.json", raw["config"]) if raw.get("config") is not None else None
    return TargetFacts(where, config, _tokenizer(host, raw.get("tokenizer") or {}), [_file(host, f) for f in files])
