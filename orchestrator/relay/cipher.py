"""Which data plane and SSH cipher a relay uses, and the sentence that says why."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.core.errors import InputError
from orchestrator.relay import plan as rp
from orchestrator.relay import processes as ps
from orchestrator.relay.plane import DataPlane
from orchestrator.relay.result import RelayOptions
from orchestrator.transport import Connector


def plane_choice(o: RelayOptions) -> tuple[str, str | None, bool]:
    """(data plane kind, cipher to ask for first, whether --cipher fixed it)."""
    if o.data_plane not in ("auto", "ssh", "paramiko"):
        raise InputError(f"--data-plane {o.data_plane!r}: expected auto, ssh or paramiko")
    kind = o.data_plane if o.data_plane != "auto" else ("ssh" if ps.have_ssh() else "paramiko")
    if kind == "ssh" and not ps.have_ssh():
        raise InputError("--data-plane ssh: there is no `ssh` binary on this machine",
                         hint="install openssh-client, or use --data-plane paramiko")
    if kind == "paramiko":
        return kind, o.cipher or rp.FAST_CIPHER, bool(o.cipher)
    if not o.cipher:  # the streams fall back to ssh's default if the local ssh lacks it (plane.DataPlane)
        return kind, rp.FAST_CIPHER, False
    cipher, _ = rp.cipher_choice(o.cipher, ps.client_ciphers(), {"": True})
    return kind, cipher, True


def check_paramiko_cipher(transport: Any, cipher: str | None) -> None:
    supported = ps.paramiko_ciphers(transport)
    if cipher and cipher not in supported:
        raise InputError(f"--cipher {cipher!r} is not supported by paramiko", hint="supported: " + ", ".join(supported))


def reason(plane: DataPlane, explicit: bool) -> str:
    if explicit:
        return "as requested with --cipher"
    if plane.cipher_note:
        return plane.cipher_note
    if plane.kind == "paramiko":
        return "paramiko data plane (the cipher both ends agreed on)"
    if plane.cipher == rp.FAST_CIPHER:
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
        answers = list(pool.map(lambda h: ps.probe_cipher(connector.resolved(h), wanted, timeout), (src, dst)))
    offers = dict(zip((src, dst), answers, strict=True))
    if requested:
        refused = [h for h, ok in offers.items() if not ok]
        if refused:
            raise InputError(f"--cipher {requested}: not offered by {', '.join(refused)}")
        return requested, "as requested with --cipher"
    return rp.cipher_choice(None, ps.client_ciphers(), offers)
