"""Which data plane and SSH cipher a relay uses, and the sentence that says why.

What the ends offer: the local ssh's ciphers (``ssh -Q cipher``), paramiko's, and whether a host accepts a
cipher (one short bulk ssh each, which also proves the bulk settings work before any byte moves).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.core.errors import HostError, InputError
from orchestrator.relay.plan import FAST_CIPHER, cipher_choice
from orchestrator.relay.plane import DataPlane
from orchestrator.relay.processes import bulk_argv
from orchestrator.relay.result import RelayOptions
from orchestrator.transport import Connector
from orchestrator.transport.bulk import ssh_binary
from orchestrator.transport.resolve import ResolvedHost


def plane_choice(o: RelayOptions) -> tuple[str, str | None, bool]:
    """(data plane kind, cipher to ask for first, whether --cipher fixed it)."""
    if o.data_plane not in ("auto", "ssh", "paramiko"):
        raise InputError(f"--data-plane {o.data_plane!r}: expected auto, ssh or paramiko")
    kind = o.data_plane if o.data_plane != "auto" else ("ssh" if have_ssh() else "paramiko")
    if kind == "ssh" and not have_ssh():
        raise InputError("--data-plane ssh: there is no `ssh` binary on this machine",
                         hint="install openssh-client, or use --data-plane paramiko")
    if kind == "paramiko":
        return kind, o.cipher or FAST_CIPHER, bool(o.cipher)
    if not o.cipher:  # the streams fall back to ssh's default if the local ssh lacks it (plane.DataPlane)
        return kind, FAST_CIPHER, False
    cipher, _ = cipher_choice(o.cipher, client_ciphers(), {"": True})
    return kind, cipher, True


def check_paramiko_cipher(transport: Any, cipher: str | None) -> None:
    supported = paramiko_ciphers(transport)
    if cipher and cipher not in supported:
        raise InputError(f"--cipher {cipher!r} is not supported by paramiko", hint="supported: " + ", ".join(supported))


def cipher_reason(plane: DataPlane, explicit: bool) -> str:
    if explicit:
        return "as requested with --cipher"
    if plane.cipher_note:
        return plane.cipher_note
    if plane.kind == "paramiko":
        return "paramiko data plane (the cipher both ends agreed on)"
    if plane.cipher == FAST_CIPHER:
        return "offered by both ends (about twice as fast as the default chacha20)"
    return "ssh default"


def dry_run_cipher(plane: DataPlane, connector: Connector, src: str, dst: str, requested: str | None
                   ) -> tuple[str | None, str]:
    """A dry run asks each host (one short ssh each) whether it offers the fast cipher."""
    if plane.kind == "paramiko":
        return plane.cipher, "paramiko data plane (preferred cipher)"
    wanted = plane.cipher
    if wanted is None:
        return None, "ssh default (the local ssh lacks aes128-gcm)"
    timeout = connector.connect_timeout + 10
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dfo-relay-probe") as pool:
        answers = list(pool.map(lambda h: probe_cipher(connector.resolved(h), wanted, timeout), (src, dst)))
    offers = dict(zip((src, dst), answers, strict=True))
    if requested:
        refused = [h for h, ok in offers.items() if not ok]
        if refused:
            raise InputError(f"--cipher {requested}: not offered by {', '.join(refused)}")
        return requested, "as requested with --cipher"
    return cipher_choice(None, client_ciphers(), offers)


_CLIENT_CIPHERS: list[str] | None = None


def client_ciphers() -> list[str]:
    global _CLIENT_CIPHERS
    if _CLIENT_CIPHERS is None:
        exe = ssh_binary()
        if exe is None:
            _CLIENT_CIPHERS = []
        else:
            proc = subprocess.run([exe, "-Q", "cipher"], capture_output=True, text=True, timeout=10)
            _CLIENT_CIPHERS = proc.stdout.split() if proc.returncode == 0 else []
    return _CLIENT_CIPHERS


def probe_cipher(host: ResolvedHost, cipher: str, timeout: float) -> bool:
    """Does `host` accept `cipher`? Also proves the bulk ssh settings work before any byte moves."""
    argv = bulk_argv(host, "true", cipher)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise HostError(host.name, f"bulk ssh connection did not answer within {timeout:.0f}s") from None
    if proc.returncode == 0:
        return True
    err = proc.stderr.strip()
    if "no matching cipher" in err.lower():
        return False
    raise HostError(host.name, f"bulk ssh connection failed: {err or f'exit {proc.returncode}'}",
                    hint=f"the command was: {shlex.join(argv[:1] + ['...', host.hostname, 'true'])}")


def paramiko_ciphers(transport: Any) -> list[str]:
    return list(transport.get_security_options().ciphers)


def have_ssh() -> bool:
    return shutil.which("ssh") is not None
