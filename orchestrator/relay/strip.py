"""`--strip-optimizer`: turn a training checkpoint into drafter weights on the source host, so only those
cross the network. The payload's `strip-checkpoint` writes a folder under the host's workdir (named by
the checkpoint's path, size and mtime); the relay then moves that folder and removes it once verified.

A `dfo watch` session may hand its checkpoints to a resident strip worker on the training host instead
(orchestrator/watch/resident.py ``ResidentStrip``, passed as ``RelayOptions.stripper``): the same folder and
record, without a Python + torch start per checkpoint. When the worker is not running the strip is the one-shot
command."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from orchestrator.core.errors import HostError, InputError, payload_error_text
from orchestrator.relay.processes import last_lines
from orchestrator.transport import Connector
from remote_payload.models.strip_worker import strip_key
from remote_payload.resident import WORKER_GONE

__all__ = ["STRIP_DIR", "Stripped", "Stripper", "strip_key", "strip_on_source"]
STRIP_DIR = "relay-strip"
KEEP = ("source_path", "sha256", "bytes", "step", "dropped", "format")


@dataclass
class Stripped:
    folder: str                   # the weights folder on the source host (what is relayed)
    stripped_from: dict | None    # what the payload recorded about the checkpoint
    note: str = ""                # dry run: what would happen


class Stripper(Protocol):
    """A resident strip worker on one host, as strip_on_source uses it."""

    host: str

    def worker_for(self, path: str) -> tuple[str, str] | None:
        """(its interpreter, its folder) when the worker takes PATH's strip, or None: strip it one-shot."""

    def gone(self, why: str) -> None:
        """The worker stopped before it took the checkpoint (the one-shot strip follows)."""


def strip_on_source(connector: Connector, host_name: str, path: str, wait_stable: float, dry_run: bool,
                    call: Callable[..., Any], stripper: Stripper | None = None) -> Stripped:
    """Strip HOST:PATH into its weights folder (or say what would happen, for a dry run)."""
    from orchestrator.deploy.manifest import default_payload_root
    from orchestrator.deploy.operation import deploy, payload_dir

    host = connector.inventory.hosts[host_name]
    facts = call(host_name, "source_facts", path=path, wait_stable=wait_stable)
    if facts.get("kind") != "file":
        what = {"dir": "a directory", "missing": "missing"}.get(facts.get("kind"), "not a regular file")
        raise InputError(f"--strip-optimizer needs a training checkpoint file; {host_name}:{path} is {what}")
    out_dir = posixpath.join(host.workdir, STRIP_DIR, strip_key(path, facts["size"], facts["mtime_ns"]))
    python = call(host_name, "python_for", venv=host.venv, fallback=host.python)["python"]
    if dry_run:
        return Stripped(out_dir, None, f"would deploy the payload to {host_name}, strip {path} there with "
                                       f"{python} into {out_dir}, and relay that folder")
    outcome = deploy(connector, [host_name], root=default_payload_root())[host_name]
    if outcome.error is not None:
        raise outcome.error
    env = connector.inventory.host_env(host_name) or None
    resident = stripper if stripper is not None and stripper.host == host_name else None
    worker = resident.worker_for(path) if resident is not None else None
    res = None
    if worker is not None:
        cmd = (f"cd {shlex.quote(payload_dir(host.workdir))} && exec {shlex.quote(worker[0])} -m remote_payload "
               f"strip-handover --worker-dir {shlex.quote(worker[1])} {shlex.quote(path)} {shlex.quote(out_dir)}")
        res = connector.session(host_name).run(cmd, check=False, env=env)
        if res.exit_code == WORKER_GONE and resident is not None:
            resident.gone(last_lines(res.err_text))
            res = None
    if res is None:
        cmd = (f"cd {shlex.quote(payload_dir(host.workdir))} && exec {shlex.quote(python)} -m remote_payload "
               f"strip-checkpoint {shlex.quote(path)} {shlex.quote(out_dir)}")
        res = connector.session(host_name).run(cmd, check=False, env=env)
    if not res.ok:
        detail = payload_error_text(res.err_text) or last_lines(res.err_text or res.text)
        raise HostError(host_name, f"strip-checkpoint of {path} failed: {detail}")
    record = call(host_name, "_read_json", path=posixpath.join(out_dir, "dfo-source.json"))
    record = record if isinstance(record, dict) else {}
    return Stripped(out_dir, {k: record[k] for k in KEEP if k in record} or None)
