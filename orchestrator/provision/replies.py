"""The replies of the provision host script, typed and checked on arrival (a host's answer is data).

Parsed once, where they arrive. The Python facts become parts of a controller-side cache path and of pip's
arguments, so machine, implementation, abi, version and glibc must match tight patterns; sizes are ints >= 0;
the wheels a host says it needs must be names the controller offered. A reply of any other shape is a
HostError naming the host, the reply and the field, never a KeyError or a traceback later.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.errors import HostError
from orchestrator.core.host_text import whole_number
from orchestrator.provision.wheelhouse import Target

_MACHINE_RE = re.compile(r"^[A-Za-z0-9_]{1,32}\Z")                    # x86_64, aarch64, ppc64le, s390x
_IMPLEMENTATION_RE = re.compile(r"^[a-z]{1,16}\Z")                     # cp, pp, graalpy
_ABI_RE = re.compile(r"^[a-z]{1,16}[0-9]{2,4}t?\Z")                    # cp311, cp313t
_PYTHON_VERSION_RE = re.compile(r"^[0-9]{1,2}\.[0-9]{1,3}\.[0-9]{1,3}(?:(?:a|b|rc)[0-9]{1,3})?\+?\Z")
_GLIBC_RE = re.compile(r"^[0-9]{1,2}\.[0-9]{1,3}\Z")                    # 2.36
_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!_-]{0,63}\Z")            # uv 0.13.9, torch 2.13.0+cpu
_DIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")          # a distribution name
_STEP_RE = re.compile(r"^[a-z][a-z ]{0,63}\Z")                          # "uv pip sync", "engine import check"
_LINE_RE = re.compile(r"^[^\x00-\x1f\x7f]{0,4096}\Z")                   # one line, no control characters
_PATH_RE = re.compile(r"^/[^\x00-\x1f\x7f]{0,4095}\Z")                   # an absolute path on the host
_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,4096}\Z")                    # a path or a command, one line
_TEXT_RE = re.compile(r".{0,65536}", re.S)  # a tool's own words (shown as host text, not read by dfo)

# The PEP 508 environment the host script reports (PYTHON_FACTS): all of it, as lock markers may use any.
MARKER_KEYS = ("implementation_name", "implementation_version", "os_name", "platform_machine", "platform_release",
               "platform_system", "platform_version", "python_full_version", "platform_python_implementation",
               "python_version", "sys_platform")
# The venv marker's fields the plan compares (the controller wrote them; the host hands them back).
_MARKER_FIELDS = ("lock", "lock_sha256", "python", "flavour", "torch_backend", "uv", "engine", "engine_setup",
                  "hash")
_HINT = ("dfo's host script does not answer like that: treat the host as compromised, or look for something "
         "on it (a wrapper around python, a shell start-up file) that changes what its Python prints")
_MISSING = object()


def _is(pattern: re.Pattern, value: Any) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


class _Fields:
    """One object of a reply; each read names the host, the reply and the field when the value is wrong."""

    def __init__(self, host: str, reply: str, obj: Any, where: str = ""):
        self.host, self.reply, self.where = host, reply, where
        if not isinstance(obj, dict):
            raise self.bad(where.rstrip(".") or "the reply", obj, "an object")
        self.obj = obj

    def bad(self, name: str, value: Any, expected: str) -> HostError:
        shown = "missing" if value is _MISSING else f"{value!r:.120}"
        return HostError(self.host, f"provision: malformed reply to {self.reply}: {name} is {shown} "
                         f"(expected {expected})", hint=_HINT)

    def _get(self, key: str, optional: bool) -> Any:
        value = self.obj.get(key, _MISSING)
        return None if optional and (value is None or value is _MISSING) else value

    def sub(self, key: str) -> _Fields:
        return _Fields(self.host, self.reply, self._get(key, False), f"{self.where}{key}.")

    def text(self, key: str, pattern: re.Pattern = _LINE_RE, expected: str = "one line of text", *,
             optional: bool = False) -> Any:
        value = self._get(key, optional)
        if value is None and optional:
            return None
        if not _is(pattern, value):
            raise self.bad(self.where + key, value, expected)
        return value

    def texts(self, keys: tuple[str, ...]) -> dict[str, str]:
        """{key: one line of text} for every one of KEYS (other keys are dropped)."""
        return {key: self.text(key) for key in keys}

    def flag(self, key: str) -> bool:
        value = self._get(key, False)
        if not isinstance(value, bool):
            raise self.bad(self.where + key, value, "true or false")
        return value

    def size(self, key: str, *, optional: bool = False) -> Any:
        value = self._get(key, optional)
        if value is None and optional:
            return None
        if not whole_number(value):
            raise self.bad(self.where + key, value, "a whole number from 0 to 2**63-1")
        return value

    def seconds(self, key: str) -> float:
        value = self._get(key, False)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1e9:
            raise self.bad(self.where + key, value, "a number of seconds")
        return float(value)

    def packages(self, key: str) -> dict[str, str | None]:
        """{distribution: version or None}: what the host read from the venv's metadata."""
        value = self._get(key, False)
        if not isinstance(value, dict) or not all(_is(_DIST_RE, k) and (v is None or _is(_VERSION_RE, v))
                                                  for k, v in value.items()):
            raise self.bad(self.where + key, value, "distribution names mapped to versions or null")
        return dict(value)


# ------------------------------------------------------------------------------ python facts


@dataclass(frozen=True)
class PythonFacts:
    """An interpreter on the host (PYTHON_FACTS); the fields past ``error`` are set when ``found``."""

    found: bool
    error: str = ""
    path: str = ""                   # the interpreter as the host resolved it (the inventory's may be relative)
    version: str = ""                # "3.11.2"
    implementation: str = ""         # "cp"
    abi: str = ""                    # "cp311"
    machine: str = ""                # "x86_64"
    glibc: str | None = None         # "2.36"; None: not glibc (musl...)
    markers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, host: str, reply: str, obj: Any, where: str = "") -> PythonFacts:
        f = _Fields(host, reply, obj, where)
        if not f.flag("found"):
            return cls(False, error=f.text("error", _TEXT_RE, "text", optional=True) or "")
        return cls(  # read in this order: the first wrong field is the one named
            True, path=f.text("path", _NAME_RE, "a path"),
            version=f.text("version", _PYTHON_VERSION_RE, "a Python version like 3.11.2"),
            implementation=f.text("implementation", _IMPLEMENTATION_RE, "lower-case letters, like cp"),
            abi=f.text("abi", _ABI_RE, "an ABI tag like cp311"),
            machine=f.text("machine", _MACHINE_RE, "letters, digits and '_', like x86_64"),
            glibc=f.text("glibc", _GLIBC_RE, "a glibc version like 2.36, or null", optional=True),
            markers=f.sub("markers").texts(MARKER_KEYS),
        )

    @property
    def target(self) -> Target:
        """What wheels for this interpreter must match."""
        return Target(python_version=self.version, implementation=self.implementation, abi=self.abi,
                      machine=self.machine, glibc=self.glibc, markers=dict(self.markers))


# ------------------------------------------------------------------------------------- probe


@dataclass(frozen=True)
class UvFound:
    source: str                      # "dfo" (pushed by dfo earlier) | "host" (the host's own)
    path: str
    version: str | None              # None: it did not run


@dataclass(frozen=True)
class VenvFacts:
    exists: bool = False
    python: bool = False             # <venv>/bin/python exists
    marker: dict | None = None       # the marker dfo wrote after the last verified sync (fields checked)

    @property
    def packages(self) -> dict[str, str | None]:
        return dict((self.marker or {}).get("packages") or {})


def _marker(f: _Fields) -> dict | None:
    if f.obj.get("marker") is None:
        return None
    m = f.sub("marker")
    for key in _MARKER_FIELDS:
        m.text(key, optional=True)
    if m.obj.get("packages") is not None:
        m.packages("packages")
    return dict(m.obj)


@dataclass(frozen=True)
class ProbeFacts:
    """Everything the plan needs from the host (host_script.probe), in one round trip."""

    python: PythonFacts
    uv: tuple[UvFound, ...] = ()
    venv: VenvFacts = field(default_factory=VenvFacts)
    gpu_found: bool | None = None    # None: not looked for (the inventory says)
    free_bytes: int | None = None    # under the workdir; None: unknown
    free_bytes_venv: int | None = None
    https_proxy: bool = False

    @classmethod
    def parse(cls, host: str, obj: Any) -> ProbeFacts:
        f = _Fields(host, "probe", obj)
        uv = f.obj.get("uv", _MISSING)
        if not isinstance(uv, list):
            raise f.bad("uv", uv, "a list")
        found = []
        for i, entry in enumerate(uv):
            e = _Fields(host, "probe", entry, f"uv[{i}].")
            found.append(UvFound(source=e.text("source", re.compile(r"^(dfo|host)\Z"), "'dfo' or 'host'"),
                                 path=e.text("path", _PATH_RE, "an absolute path"),
                                 version=e.text("version", _VERSION_RE, "a version, or null", optional=True)))
        venv = f.sub("venv")
        gpu = f.sub("gpu").flag("found") if f.obj.get("gpu") is not None else None
        return cls(python=PythonFacts.parse(host, "probe", f.obj.get("python", _MISSING), "python."),
                   uv=tuple(found), venv=VenvFacts(venv.flag("exists"), venv.flag("python"), _marker(venv)),
                   gpu_found=gpu, free_bytes=f.size("free_bytes", optional=True),
                   free_bytes_venv=f.size("free_bytes_venv", optional=True), https_proxy=f.flag("https_proxy"))


# ------------------------------------------------------------------------------- the wheel pool


def all_reachable(host: str, obj: Any, targets: Collection[str]) -> bool:
    """host_script.reachable: {index host: true/false}; one that is not answered counts as unreachable."""
    f = _Fields(host, "reachable", obj)
    return all(f.flag(t) if t in f.obj else False for t in targets)


def pool_listing(host: str, obj: Any) -> dict[str, int]:
    """host_script.pool_listing: {file name: size} (only compared with the wheelhouse's own names)."""
    f = _Fields(host, "pool_listing", obj)
    return {name: f.size(name) for name in f.obj}


def pool_need(host: str, obj: Any, offered: Collection[str]) -> list[str]:
    """host_script.pool_state: the wheels the pool lacks, each one the controller offered (once)."""
    f = _Fields(host, "pool_state", obj)
    need = f.obj.get("need", _MISSING)
    if not isinstance(need, list):
        raise f.bad("need", need, "a list of wheel names")
    # Only names of the controller's own wheelhouse may be asked for: they become local files to read and upload.
    strange = [n for n in need if not isinstance(n, str) or n not in offered]
    if strange or len(set(need)) != len(need):
        raise HostError(host, f"provision: the host asked for wheels the controller did not offer: "
                        f"{(strange or need)[:5]!r:.300}", hint=_HINT)
    return list(need)


def check_accepted(host: str, obj: Any, files: Collection[str]) -> None:
    """host_script.accept: every uploaded file verified and moved into place."""
    f = _Fields(host, "accept", obj)
    accepted = f.obj.get("accepted", _MISSING)
    if accepted != sorted(files):
        raise f.bad("accepted", accepted, f"the {len(files)} uploaded names")


# ------------------------------------------------------------------------------- venv and sync


@dataclass(frozen=True)
class StepFailure:
    """An expected failure on the host: the step, the command (argv) and the tool's own words."""

    step: str
    command: tuple[str, ...]
    message: str


def _outcome(host: str, reply: str, obj: Any) -> tuple[_Fields, StepFailure | None]:
    f = _Fields(host, reply, obj)
    if f.flag("ok"):
        return f, None
    command = f.obj.get("command", _MISSING)
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise f.bad("command", command, "a list of strings")
    return f, StepFailure(f.text("step", _STEP_RE, "a step name"), tuple(command),
                          f.text("message", _TEXT_RE, "text"))


@dataclass(frozen=True)
class Prepared:
    """host_script.prepare_venv: the venv exists; its interpreter's facts."""

    python: PythonFacts

    @classmethod
    def parse(cls, host: str, obj: Any) -> Prepared | StepFailure:
        f, failed = _outcome(host, "prepare_venv", obj)
        if failed is not None:
            return failed
        python = PythonFacts.parse(host, "prepare_venv", f.obj.get("python", _MISSING), "python.")
        if not python.found:
            raise f.bad("python.found", False, "true: the host said the venv was made")
        return cls(python)


@dataclass(frozen=True)
class Synced:
    """host_script.sync: the venv holds the lock, verified; the marker is written."""

    packages: dict[str, str | None]
    seconds: float                   # in uv pip sync
    engine_seconds: float | None     # in an engine venv's set-up and import check

    @classmethod
    def parse(cls, host: str, obj: Any) -> Synced | StepFailure:
        f, failed = _outcome(host, "sync", obj)
        if failed is not None:
            return failed
        marker = f.sub("marker")
        check = marker.sub("engine_check").seconds("seconds") if marker.obj.get("engine_check") is not None else None
        return cls(f.packages("packages"), f.seconds("seconds"), check)
