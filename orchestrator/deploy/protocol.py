"""The replies of the deploy host script, typed and checked on arrival (a host's answer is data)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.core.errors import HostError


def _str_or_none(host: str, what: str, value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise HostError(host, f"deploy: unexpected {what} in the host's reply: {value!r:.80}")


def _str_map(host: str, what: str, value) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise HostError(host, f"deploy: unexpected {what} in the host's reply (expected name -> sha256)")
    return value


@dataclass(frozen=True)
class ReleaseState:
    """What a host runs now: the active and previous release ids and the sha256 of every active file."""

    current: str | None
    previous: str | None
    files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_host(cls, host: str, reply) -> "ReleaseState":
        if not isinstance(reply, dict):
            raise HostError(host, "deploy: the host's state reply is not an object")
        return cls(_str_or_none(host, "current release", reply.get("current")),
                   _str_or_none(host, "previous release", reply.get("previous")),
                   _str_map(host, "file list", reply.get("files", {})))


@dataclass(frozen=True)
class Staged:
    """A staging folder prepared on the host, and the files it still needs from the controller."""

    staging: str
    need: list[str]

    @classmethod
    def from_host(cls, host: str, reply, expected: dict) -> "Staged":
        need = reply.get("need") if isinstance(reply, dict) else None
        staging = reply.get("staging") if isinstance(reply, dict) else None
        # Only names of our own manifest may be asked for: they become local paths to read and upload.
        if not isinstance(staging, str) or not isinstance(need, list) or any(n not in expected for n in need):
            raise HostError(host, "deploy: the host asked for files that are not in the payload manifest")
        return cls(staging, list(need))


@dataclass(frozen=True)
class Switched:
    """The release now active and the one kept for --rollback."""

    release: str
    previous: str | None

    @classmethod
    def from_host(cls, host: str, reply) -> "Switched":
        if not isinstance(reply, dict) or not isinstance(reply.get("release"), str):
            raise HostError(host, "deploy: unexpected reply to the release switch")
        return cls(reply["release"], _str_or_none(host, "previous release", reply.get("previous")))
