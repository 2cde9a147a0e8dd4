"""The inventory: which hosts exist, how to reach them, and where dfo keeps things on each.

Loading is strict (unknown keys are errors) and every error names the file, the line, the field path,
what was expected and what was found. Nothing here touches the network.
"""

from __future__ import annotations

import getpass
import os
import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError
from ruamel.yaml import YAML
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.nodes import MappingNode, Node, SequenceNode

from orchestrator.core.errors import InputError

DEFAULT_INVENTORY = "inventory.yaml"
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
# What may reach ssh as a destination, a HostName or a user: never a leading '-' (it would be read as an
# option: `-oProxyCommand=…` runs a local command), no spaces, quotes or shell characters.
ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\[?[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]?)\Z")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def _port(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError("port", "expected an integer 1-65535")
    try:
        port = int(value)
    except ValueError:
        raise PydanticCustomError("port", "expected an integer 1-65535") from None
    if not 1 <= port <= 65535:
        raise PydanticCustomError("port", "expected an integer 1-65535")
    return port


def _remote_path(value: Any) -> Any:
    # Remote paths reach a shell quoted, so `~` would not expand: insist on absolute paths.
    if not isinstance(value, str) or not value.startswith("/"):
        raise PydanticCustomError("abs_path", "expected an absolute path on the host (starting with /)")
    return posixpath.normpath(value)


def _address(value: Any) -> Any:
    if isinstance(value, str) and not ADDRESS_RE.match(value):
        raise PydanticCustomError("address", "expected a host name, IP address or ssh_config alias "
                                  "(letters, digits, '.', '_', '-', ':'; not starting with '-')")
    return value


def _user(value: Any) -> Any:
    if isinstance(value, str) and not USER_RE.match(value):
        raise PydanticCustomError("user", "expected a user name (letters, digits, '.', '_', '-'; "
                                  "not starting with '-')")
    return value


def _env(value: Any) -> Any:
    # Keys become environment variable names on the host: shell identifiers only (a key `A;id;B` would run
    # `id`). Values travel in a file or on stdin, never in a command line; a NUL cannot be in an environment.
    if not isinstance(value, dict):
        return value
    for key, val in value.items():
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            raise PydanticCustomError("env", f"env key {str(key)[:40]!r} is not a shell identifier "
                                      "([A-Za-z_][A-Za-z0-9_]*)")
        if isinstance(val, str) and ("\x00" in val or "\n" in val):
            raise PydanticCustomError("env", f"env value of {key} contains a NUL or a newline")
    return value


Port = Annotated[int, BeforeValidator(_port)]
RemotePath = Annotated[str, BeforeValidator(_remote_path)]
Address = Annotated[str, BeforeValidator(_address)]
User = Annotated[str, BeforeValidator(_user)]
Env = Annotated[dict[str, str], BeforeValidator(_env)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, validate_assignment=True)


class HostPaths(_Strict):
    """Role paths on the host. ``venv`` defaults to ``<workdir>/venv``, ``engine_venv`` (the vLLM engine's own
    venv, `dfo provision --engine vllm`) to ``<workdir>/engines/vllm``."""

    checkpoints: RemotePath | None = None
    models: RemotePath | None = None
    venv: RemotePath | None = None
    engine_venv: RemotePath | None = None


class Host(_Strict):
    description: str | None = None
    address: Address | None = Field(None, description="hostname, IP address or ssh_config alias")
    ssh_alias: Address | None = Field(None,
                                      description="take HostName/User/Port/IdentityFile/ProxyJump from ssh_config")
    port: Port | None = None
    user: User | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None
    workdir: RemotePath
    python: str = "python3"
    gpu: bool | None = Field(None, description="None: detect with nvidia-smi")
    torch_backend: str | None = Field(None, description="uv --torch-backend value, e.g. cu128; default from gpu")
    allow_python_download: bool = False
    roles: list[Literal["train", "eval"]] = []
    paths: HostPaths = HostPaths()
    reaches: list[str] = Field(default_factory=list, description="hosts this one can reach directly")
    env: Env = Field(default_factory=dict, description="environment for remote jobs (values never printed)")
    serve_url: str | None = Field(None, description="OpenAI-compatible endpoint serving the target")

    @model_validator(mode="after")
    def _one_address(self) -> "Host":
        if self.address and self.ssh_alias:
            raise PydanticCustomError("address", "give either 'address' or 'ssh_alias', not both")
        if not self.address and not self.ssh_alias:
            raise PydanticCustomError("address", "missing 'address' (or 'ssh_alias')")
        return self

    @property
    def venv(self) -> str:
        return self.paths.venv or posixpath.join(self.workdir, "venv")

    @property
    def engine_venv(self) -> str:
        return self.paths.engine_venv or posixpath.join(self.workdir, "engines", "vllm")


class Inventory(_Strict):
    ssh_config: str | None = None
    hosts: dict[str, Host]

    # Where it was read from (not part of the file).
    _source: Path | None = PrivateAttr(None)

    @property
    def source(self) -> Path:
        return self._source or Path(DEFAULT_INVENTORY)

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def select(self, names: list[str] | tuple[str, ...] | None) -> list[str]:
        """Host names to act on: the given ones (validated) or all, in inventory order."""
        if not names:
            return list(self.hosts)
        unknown = [n for n in names if n not in self.hosts]
        if unknown:
            raise InputError(
                f"unknown host {', '.join(repr(n) for n in unknown)} in {self.source}",
                hint=f"known hosts: {', '.join(self.hosts) or '(none)'}",
            )
        return list(dict.fromkeys(names))


# ----------------------------------------------------------------------------------- loading


def inventory_path(cli_value: str | os.PathLike | None) -> Path:
    """The inventory file: --inventory, else $DFO_INVENTORY, else ./inventory.yaml."""
    return Path(cli_value or os.environ.get("DFO_INVENTORY") or DEFAULT_INVENTORY)


def load_inventory(path: str | os.PathLike) -> Inventory:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"inventory file not found: {path}",
            hint="pass --inventory PATH or set DFO_INVENTORY (see README: 'The inventory')",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read inventory {path}: {exc}") from None
    return parse_inventory(text, path)


def parse_inventory(text: str, path: Path) -> Inventory:
    data, root = _parse_yaml(text, path)
    if data is None:
        raise InputError(f"{path}: the inventory is empty", hint="it needs at least a 'hosts:' mapping")
    if not isinstance(data, dict):
        raise InputError(f"{path}:1: expected a mapping with 'hosts:' at the top, got {type(data).__name__}")
    _check_host_names(data, root, path)
    try:
        inv = Inventory.model_validate(_plain(data))
    except ValidationError as exc:
        raise InputError(_format_validation_error(exc, root, path)) from None
    inv._source = path
    _check_references(inv, root, path)
    return inv


def _parse_yaml(text: str, path: Path) -> tuple[Any, Node | None]:
    yaml = YAML(typ="rt")
    try:
        data = yaml.load(text)
        root = YAML(typ="rt").compose(text)
    except DuplicateKeyError as exc:
        key = re.search(r'found duplicate key "([^"]*)"', str(exc))
        where = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        first = exc.context_mark.line + 1 if exc.context_mark else "?"
        what = f"duplicate key '{key.group(1)}'" if key else "duplicate key"
        raise InputError(
            f"{path}:{where}: {what} (first defined in the mapping at line {first})",
            hint="each host name and field may appear once; remove or rename one of them",
        ) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = f"{mark.line + 1}:{mark.column + 1}" if mark else "?"
        raise InputError(f"{path}:{loc}: YAML syntax error: {exc.problem or exc.context}") from None
    return data, root


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _check_host_names(data: dict, root: Node | None, path: Path) -> None:
    hosts = data.get("hosts")
    if not isinstance(hosts, dict):
        return
    for name in hosts:
        if not isinstance(name, str) or not HOST_NAME_RE.match(name):
            line = _line_of(root, ("hosts", name))
            raise InputError(
                f"{path}:{line} hosts.{name}: expected a host name of letters, digits, '.', '_' or '-', got {name!r}"
            )


def _check_references(inv: Inventory, root: Node | None, path: Path) -> None:
    for name, host in inv.hosts.items():
        for i, other in enumerate(host.reaches):
            if other not in inv.hosts:
                line = _line_of(root, ("hosts", name, "reaches", i))
                raise InputError(
                    f"{path}:{line} hosts.{name}.reaches[{i}]: unknown host {other!r}",
                    hint=f"known hosts: {', '.join(inv.hosts)}",
                )


_EXPECTED = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
}


def _format_validation_error(exc: ValidationError, root: Node | None, path: Path) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field_path = _dotted(loc)
        line = _line_of(root, loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            known = _known_fields(loc[:-1])
            msg = f"unknown key {loc[-1]!r}" + (f" (expected one of: {', '.join(known)})" if known else "")
        elif kind == "missing":
            msg = "missing required field"
        elif kind == "literal_error":
            msg = f"expected one of {err['ctx']['expected']}, got {err['input']!r}"
        elif "env" in loc[:3]:  # env values may be secrets: never echo them
            msg = _EXPECTED.get(kind, err["msg"])
        else:
            expected = _EXPECTED.get(kind, err["msg"])
            msg = f"{expected}, got {err['input']!r}" if not isinstance(err["input"], dict) else expected
        lines.append((line, f"{path}:{line} {field_path}: {msg}" if field_path else f"{path}:{line} {msg}"))
    return "\n".join(text for _, text in sorted(lines, key=lambda item: item[0]))


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _known_fields(parent: tuple) -> list[str]:
    """Allowed keys of the mapping at ``parent`` (for 'unknown key' messages)."""
    if parent == ():
        model: type[BaseModel] | None = Inventory
    elif len(parent) == 2 and parent[0] == "hosts":
        model = Host
    elif len(parent) == 3 and parent[0] == "hosts" and parent[2] == "paths":
        model = HostPaths
    else:
        model = None
    return list(model.model_fields) if model else []


def _line_of(root: Node | None, loc: tuple) -> int:
    """1-based line of the deepest node along ``loc`` (the value, or the key when the value is absent)."""
    node, line = root, 1
    if node is not None:
        line = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    line, node = key.start_mark.line + 1, value
                    if not isinstance(value, (MappingNode, SequenceNode)):
                        line = value.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


# ------------------------------------------------------------------------- connection facts


@dataclass(frozen=True)
class ResolvedHost:
    """Everything needed to open SSH to one host, after ssh_config and defaults are applied."""

    name: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: str
    ssh_config: str | None
    proxy_jump: "ResolvedHost | None" = None
    connect_timeout: float = 10.0
    extra: dict = field(default_factory=dict, compare=False)
    alias: str = ""  # the name ssh_config was looked up with (the system ssh must look up the same one)

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def _local_path(value: str, base: Path) -> str:
    p = Path(os.path.expanduser(value))
    return str(p if p.is_absolute() else (base / p).resolve())


def ssh_config_path(inv: Inventory) -> str | None:
    """The ssh_config file in force: the inventory's, else ~/.ssh/config when it exists."""
    if inv.ssh_config:
        return _local_path(inv.ssh_config, inv.source.parent)
    default = Path.home() / ".ssh" / "config"
    return str(default) if default.is_file() else None


def _read_ssh_config(path: str | None):
    from orchestrator.core.ssh_config import ssh_config_class  # paramiko's parser, not paramiko's ~0.3 s import

    ssh_config = ssh_config_class()
    if not path:
        return ssh_config()
    try:
        return ssh_config.from_path(path)
    except FileNotFoundError:
        raise InputError(f"ssh_config file not found: {path}", hint="fix 'ssh_config:' in the inventory") from None
    except Exception as exc:  # paramiko raises plain exceptions for bad lines
        raise InputError(f"cannot read ssh_config {path}: {exc}") from None


def resolve_host(inv: Inventory, name: str, connect_timeout: float = 10.0, _seen: tuple = ()) -> ResolvedHost:
    """Merge the inventory entry with ssh_config (explicit inventory fields win)."""
    host = inv.hosts[name]
    cfg_path = ssh_config_path(inv)
    cfg = _read_ssh_config(cfg_path).lookup(host.ssh_alias or host.address or name)
    base = inv.source.parent
    identity = (
        (_local_path(host.identity_file, base),)
        if host.identity_file
        else tuple(os.path.expanduser(p) for p in cfg.get("identityfile", []))
    )
    known = host.known_hosts or (cfg.get("userknownhostsfile", "").split() or ["~/.ssh/known_hosts"])[0]
    jump_spec = host.proxy_jump or cfg.get("proxyjump")
    jump = _jump_chain(inv, jump_spec, connect_timeout, _seen + (name,))
    return _checked(ResolvedHost(
        name=name,
        hostname=cfg.get("hostname", host.address or host.ssh_alias),
        port=host.port or _cfg_port(cfg, cfg_path),
        user=host.user or cfg.get("user") or getpass.getuser(),
        identity_files=identity,
        known_hosts=_local_path(known, base),
        ssh_config=cfg_path,
        proxy_jump=jump,
        connect_timeout=connect_timeout,
        alias=host.ssh_alias or host.address or name,
    ))


def _cfg_port(cfg, cfg_path: str | None) -> int:
    try:
        return _port(cfg.get("port", 22))
    except PydanticCustomError:
        raise InputError(f"{cfg_path}: Port {cfg.get('port')!r}: expected an integer 1-65535") from None


def _checked(host: ResolvedHost) -> ResolvedHost:
    """Values that came from ssh_config reach the system ssh's argv too: same rules as the inventory's."""
    for what, value, pattern in (("HostName", host.hostname, ADDRESS_RE), ("User", host.user, USER_RE),
                                 ("host", host.alias, ADDRESS_RE)):
        if not pattern.match(value or ""):
            raise InputError(f"{host.name}: {what} {value!r} (from {host.ssh_config or 'the inventory'}) is not a "
                             "plain host or user name", hint="a value starting with '-' would be read as an ssh option")
    return host


def _jump_chain(inv: Inventory, spec: str | None, timeout: float, seen: tuple) -> ResolvedHost | None:
    """``ProxyJump a,b``: reach ``a``, through it ``b``, through that the host; the last hop is returned,
    each hop's ``proxy_jump`` is the one before it (an inventory hop keeps its own jump when first)."""
    if not spec or spec.strip().lower() == "none":
        return None
    previous: ResolvedHost | None = None
    for part in spec.split(","):
        hop = _resolve_jump(inv, part.strip(), timeout, seen)
        if previous is not None:
            hop = replace(hop, proxy_jump=previous)
        previous = hop
    return previous


def _resolve_jump(inv: Inventory, spec: str, timeout: float, seen: tuple) -> ResolvedHost:
    """A ProxyJump hop: an inventory host name, or ``[user@]host[:port]`` / an ssh_config alias."""
    if spec in seen:
        raise InputError(f"proxy_jump loop through {' -> '.join(seen + (spec,))}")
    if spec in inv.hosts:
        return resolve_host(inv, spec, timeout, seen)
    m = re.match(r"^(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:]+)(?::(?P<port>\d+))?$", spec)
    if not m:
        raise InputError(f"cannot parse proxy jump {spec!r}", hint="use an inventory host name or [user@]host[:port]")
    cfg_path = ssh_config_path(inv)
    alias = m["host"].strip("[]")
    cfg = _read_ssh_config(cfg_path).lookup(alias)
    return _checked(ResolvedHost(
        name=spec,
        hostname=cfg.get("hostname", alias),
        port=int(m["port"]) if m["port"] else _cfg_port(cfg, cfg_path),
        user=m["user"] or cfg.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in cfg.get("identityfile", [])),
        known_hosts=_local_path(
            (cfg.get("userknownhostsfile", "").split() or ["~/.ssh/known_hosts"])[0], inv.source.parent
        ),
        ssh_config=cfg_path,
        proxy_jump=_jump_chain(inv, cfg.get("proxyjump"), timeout, seen + (spec,)),
        connect_timeout=timeout,
        alias=alias,
    ))
