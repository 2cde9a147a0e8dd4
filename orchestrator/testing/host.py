"""One sandbox host (its name, roles, files and network place) and the rules for naming hosts."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from orchestrator.core.inventory import HOST_NAME_RE  # the inventory is the authority on host names
from orchestrator.testing.errors import SandboxError

DEFAULT_HOSTS: dict[str, list[str]] = {"kpro6": ["train"], "ct129": ["eval"]}
# On top of the inventory's rule a sandbox host's name becomes its hostname (own UTS namespace), and
# `hostname` refuses '_', a label that starts or ends with '-', and empty labels.
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\Z")
HOST_NAME_MAX = 31  # keeps namespace names and log lines short; far below Linux's 64 for a hostname


@dataclass
class SandboxHost:
    """One fake host. Paths are on this machine's filesystem, which the hosts share."""

    name: str
    roles: list[str]
    root_dir: Path
    address: str = ""
    port: int = 0
    netns: str | None = None  # network namespace (None when not isolated)
    veth: str | None = None  # host-side veth (None when not isolated)
    subnet: str | None = None  # e.g. "10.213.7.0/24"; the host is .2, this machine's side .1
    gateway: str | None = None  # this machine's address on the host's link (.1)
    proc: subprocess.Popen | None = field(default=None, repr=False)
    last_argv: list[str] = field(default_factory=list, repr=False)  # how sshd was last started

    @property
    def workdir(self) -> Path:
        return self.root_dir / "dfo"

    @property
    def checkpoints(self) -> Path:
        return self.root_dir / "checkpoints"

    @property
    def models(self) -> Path:
        return self.root_dir / "models"

    @property
    def home(self) -> Path:
        """HOME of the host's sessions with own_home=True."""
        return self.root_dir / "home"

    @property
    def host_key(self) -> Path:
        return self.root_dir / "host_key"

    @property
    def host_key_pub(self) -> Path:
        return self.root_dir / "host_key.pub"

    @property
    def sshd_config(self) -> Path:
        return self.root_dir / "sshd_config"

    @property
    def authorized_keys(self) -> Path:
        return self.root_dir / "authorized_keys"

    @property
    def log_path(self) -> Path:
        return self.root_dir / "sshd.log"

    @property
    def pidfile(self) -> Path:
        return self.root_dir / "sshd.pid"

    @property
    def pid(self) -> int | None:
        """The sshd listener's PID while it runs."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


def check_host_name(name: str) -> None:
    """A SandboxError unless `name` is a valid inventory host name that can also be a hostname."""
    if not HOST_NAME_RE.match(name) or not _HOSTNAME_RE.match(name) or len(name) > HOST_NAME_MAX:
        raise SandboxError(f"bad host name {name!r}: use letters, digits, '-' and '.' (at most {HOST_NAME_MAX}), "
                           "starting and ending with a letter or digit")


def make_hosts(hosts: Sequence[str] | Mapping[str, Sequence[str]], root: Path) -> dict[str, SandboxHost]:
    """The hosts of a sandbox in ROOT/hosts/NAME/, from names (default roles: kpro6 train, ct129 eval,
    otherwise the first train and the rest eval) or a mapping name -> roles."""
    if isinstance(hosts, Mapping):
        roles = {name: list(r) for name, r in hosts.items()}
    else:
        names = list(hosts)
        roles = {name: DEFAULT_HOSTS.get(name, ["train"] if i == 0 else ["eval"]) for i, name in enumerate(names)}
        if len(set(names)) != len(names):
            raise SandboxError(f"duplicate host names: {names}")
    if not roles:
        raise SandboxError("a sandbox needs at least one host")
    for name in roles:
        check_host_name(name)
    return {name: SandboxHost(name=name, roles=list(r), root_dir=root / "hosts" / name) for name, r in roles.items()}


class SandboxFacts(Protocol):
    """What a sandbox's client files (host_files) and its ROOT/sandbox.json (state) are written from. ``Sandbox``
    has these; the modules that write them take this, so that they need not import sandbox.py, which imports
    them (the testing package imports in one direction)."""
    run_id: str
    user: str
    python: str
    isolated: bool
    reason: str
    client_key: Path
    known_hosts_path: Path
    ssh_config_path: Path
    hosts: dict[str, SandboxHost]
