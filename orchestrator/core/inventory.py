"""The inventory: which hosts exist, how to reach them, and where dfo keeps things on each.

Loading is strict (unknown keys are errors) and every error names the file, the line, the field path,
what was expected and what was found. Nothing here touches the network; how a host is reached (ssh_config,
jump chains) is resolved in transport/resolve.py.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import Annotated, Any, Callable, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError
from ruamel.yaml import YAML
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.nodes import MappingNode, Node, SequenceNode

from orchestrator.core.errors import InputError
from orchestrator.core.slurm_section import SlurmSection, workdir_inside_shared

DEFAULT_INVENTORY = "inventory.yaml"
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
# What may reach ssh as a destination, a HostName or a user: never a leading '-' (it would be read as an
# option: `-oProxyCommand=…` runs a local command), no spaces, quotes or shell characters.
ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\[?[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]?)\Z")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# `${NAME}` in an env value is read from the controller's environment when a command uses it (so a secret
# need not live in the inventory); `$${NAME}` is a literal `${NAME}`.
ENV_REF_RE = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")
# One hop of `proxy_jump: a,b`: an inventory host or ssh_config alias, or [user@]host[:port].
JUMP_HOP_RE = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.]+\])"
                         r"(?::[0-9]{1,5})?")


def check_port(value: Any) -> int:
    """A port number (an int or a string of digits) in 1-65535."""
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
        if isinstance(val, str) and "${" in ENV_REF_RE.sub("", val):
            raise PydanticCustomError("env", f"env value of {key} has a malformed reference: write ${{NAME}} "
                                      "(NAME a shell identifier) or $${NAME} for a literal ${NAME}")
    return value


def _proxy_jump(value: Any) -> Any:
    # Each hop reaches ssh's argv (a `-W` target, a destination): no leading '-', no shell characters.
    if isinstance(value, str) and value.strip().lower() != "none":
        for hop in value.split(","):
            if not JUMP_HOP_RE.fullmatch(hop.strip()):
                raise PydanticCustomError("proxy_jump", "expected host names separated by commas, each a host of "
                                          "this inventory or [user@]host[:port] (not starting with '-')")
    return value


def _interpreter(value: Any) -> Any:
    # An interpreter the host runs by name (python3) or path: one word, never an option.
    if isinstance(value, str) and (not value.strip() or any(c.isspace() or not c.isprintable() for c in value)
                                   or value.startswith("-")):
        raise PydanticCustomError("python", "expected an interpreter: a command name like python3 or an absolute "
                                  "path like /usr/bin/python3.12 (one word, not empty, not starting with '-')")
    return value


def _url(value: Any) -> Any:
    if isinstance(value, str):
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
            raise PydanticCustomError("serve_url", "expected an http:// or https:// URL with a host, e.g. "
                                      "http://127.0.0.1:30000/v1")
    return value


Port = Annotated[int, BeforeValidator(check_port)]
RemotePath = Annotated[str, BeforeValidator(_remote_path)]
Address = Annotated[str, BeforeValidator(_address)]
User = Annotated[str, BeforeValidator(_user)]
Env = Annotated[dict[str, str], BeforeValidator(_env)]
ProxyJump = Annotated[str, BeforeValidator(_proxy_jump)]
Interpreter = Annotated[str, BeforeValidator(_interpreter)]
Url = Annotated[str, BeforeValidator(_url)]


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
    proxy_jump: ProxyJump | None = None
    workdir: RemotePath
    python: Interpreter = "python3"
    gpu: bool | None = Field(None, description="None: detect with nvidia-smi")
    torch_backend: str | None = Field(None, description="uv --torch-backend value, e.g. cu128; default from gpu")
    allow_python_download: bool = False
    roles: list[Literal["train", "eval"]] = []
    paths: HostPaths = HostPaths()
    reaches: list[str] = Field(default_factory=list, description="hosts this one can reach directly")
    env: Env = Field(default_factory=dict, description="environment for remote jobs (values never printed)")
    serve_url: Url | None = Field(None, description="OpenAI-compatible endpoint serving the target")
    slurm: SlurmSection | None = Field(None, description="the host is a Slurm login node (docs/clusters.md)")
    gpu_check: str | None = Field(None, description="this controller's copy of the host's gpu-check.json "
                                  "(relative to the inventory file): `dfo eval --dry-run` prints its expected cost")

    @model_validator(mode="after")
    def _one_address(self) -> "Host":
        if self.address and self.ssh_alias:
            raise PydanticCustomError("address", "give either 'address' or 'ssh_alias', not both")
        if not self.address and not self.ssh_alias:
            raise PydanticCustomError("address", "missing 'address' (or 'ssh_alias')")
        if self.slurm and not workdir_inside_shared(self.workdir, self.slurm.shared):
            raise PydanticCustomError("slurm_shared", f"workdir {self.workdir} is not inside slurm.shared "
                                      f"{self.slurm.shared}: compute nodes would not see the releases and the venv")
        return self

    @property
    def venv(self) -> str:
        return self.paths.venv or posixpath.join(self.workdir, "venv")

    @property
    def engine_venv(self) -> str:
        return self.engine_venv_for("vllm")

    def engine_venv_for(self, engine: str) -> str:
        """An engine's venv: ``paths.engine_venv`` when set, else ``<workdir>/engines/<engine>`` (one per engine).
        A pinned release (``vllm@0.31.0``) has its own: ``<workdir>/engines/vllm@0.31.0``, or
        ``<paths.engine_venv>@0.31.0``."""
        _, at, version = engine.partition("@")
        if self.paths.engine_venv:
            return f"{self.paths.engine_venv}@{version}" if at else self.paths.engine_venv
        return posixpath.join(self.workdir, "engines", engine)


class Inventory(_Strict):
    ssh_config: str | None = None
    hosts: dict[str, Host]

    # Where it was read from (not part of the file).
    _source: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _no_jump_loop(self) -> "Inventory":
        """A host reached through itself by the inventory's own proxy_jump hops (ssh_config's are checked when a
        host is resolved): refused when the file is read or edited, as `inventory check` refuses it."""
        for name in self.hosts:
            path, todo = [name], self._jumps(name)
            while todo:
                hop = todo.pop(0)
                if hop == name:
                    raise PydanticCustomError("proxy_jump", f"hosts.{name}.proxy_jump: proxy_jump loop through "
                                              f"{' -> '.join(path + [hop])} (a host cannot be reached through "
                                              "itself)")
                if hop not in path:
                    path.append(hop)
                    todo += self._jumps(hop)
        return self

    def _jumps(self, name: str) -> list[str]:
        spec = self.hosts[name].proxy_jump if name in self.hosts else None
        if not spec or spec.strip().lower() == "none":
            return []
        return [h.strip() for h in spec.split(",") if h.strip() in self.hosts]

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

    def host_env(self, name: str) -> dict[str, str]:
        """NAME's ``env:`` for a command that uses it now: every ``${VAR}`` read from this process's environment."""
        return {key: expand_env_value(name, key, value) for key, value in self.hosts[name].env.items()}


def expand_env_value(host: str, key: str, value: str) -> str:
    """One env value with its ``${VAR}`` references filled in; an unset VAR is bad input (the value is a
    secret's place: never in a message)."""

    def fill(m: re.Match) -> str:
        escaped, var = m.group(1), m.group(2)
        if escaped:
            return "${" + var + "}"
        if var not in os.environ:
            raise InputError(f"{host}: env {key} refers to ${{{var}}}, which is not set in dfo's environment",
                             hint=f"export {var} before running dfo (hosts.{host}.env.{key} reads it when used)")
        found = os.environ[var]
        if "\n" in found or "\x00" in found:
            raise InputError(f"{host}: env {key}: ${{{var}}} contains a newline or a NUL")
        return found

    return ENV_REF_RE.sub(fill, value)


# ----------------------------------------------------------------------------------- loading

# Where an error is: "FILE:LINE" for a line of the text being parsed (an edit maps it to the real file).
Where = Callable[[int], str]


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
            hint="pass --inventory PATH or set DFO_INVENTORY (see docs/inventory.md)",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read inventory {path}: {exc}") from None
    return parse_inventory(text, path)


def parse_inventory(text: str, path: Path, where: Where | None = None) -> Inventory:
    """Validate TEXT as the inventory at PATH. WHERE names a line of TEXT in messages (default ``PATH:LINE``)."""
    at: Where = where or (lambda line: f"{path}:{line}")
    data, root = _parse_yaml(text, path, at)
    if data is None:
        raise InputError(f"{path}: the inventory is empty", hint="it needs at least a 'hosts:' mapping")
    if not isinstance(data, dict):
        raise InputError(f"{at(1)}: expected a mapping with 'hosts:' at the top, got {_kind(data)}",
                         hint="the file starts with `hosts:` and one indented block per host (see docs/inventory.md)")
    _check_host_names(data, root, at)
    try:
        inv = Inventory.model_validate(_plain(data))
    except ValidationError as exc:
        raise InputError(_format_validation_error(exc, root, at)) from None
    inv._source = path
    if not inv.hosts:
        raise InputError(f"{at(_line_of(root, ('hosts',)))} hosts: no hosts (expected at least one host under "
                         "'hosts:')", hint="add one with `dfo inventory add-host NAME --address ADDRESS`")
    _check_references(inv, root, at)
    return inv


def _kind(value: Any) -> str:
    """What a YAML value is, in the words of the messages (not ruamel's class names)."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    return f"a string ({str(value)[:40]!r})"


def _parse_yaml(text: str, path: Path, at: Where) -> tuple[Any, Node | None]:
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
            f"{at(where) if isinstance(where, int) else f'{path}:?'}: {what} (first defined in the mapping at "
            f"line {first})",
            hint="each host name and field may appear once; remove or rename one of them",
        ) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = f"{at(mark.line + 1)}:{mark.column + 1}" if mark else f"{path}:?"
        raise InputError(f"{loc}: YAML syntax error: {exc.problem or exc.context}") from None
    return data, root


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _check_host_names(data: dict, root: Node | None, at: Where) -> None:
    hosts = data.get("hosts")
    if not isinstance(hosts, dict):
        return
    for name in hosts:
        if not isinstance(name, str) or not HOST_NAME_RE.match(name):
            line = _line_of(root, ("hosts", name))
            raise InputError(
                f"{at(line)} hosts.{name}: expected a host name of letters, digits, '.', '_' or '-', got {name!r}"
            )


def _check_references(inv: Inventory, root: Node | None, at: Where) -> None:
    for name, host in inv.hosts.items():
        for i, other in enumerate(host.reaches):
            if other not in inv.hosts:
                line = _line_of(root, ("hosts", name, "reaches", i))
                raise InputError(
                    f"{at(line)} hosts.{name}.reaches[{i}]: unknown host {other!r}",
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


def _format_validation_error(exc: ValidationError, root: Node | None, at: Where) -> str:
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
        lines.append((line, f"{at(line)} {field_path}: {msg}" if field_path else f"{at(line)} {msg}"))
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
    elif len(parent) == 3 and parent[0] == "hosts" and parent[2] == "slurm":
        model = SlurmSection
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
