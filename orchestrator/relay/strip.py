"""`--strip-optimizer`: turn a training checkpoint into drafter weights on the source host, so only those
cross the network. The payload's `strip-checkpoint` writes a folder under the host's workdir (named by
the checkpoint's path, size and mtime); the relay then moves that folder and removes it once verified."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from orchestrator.core.errors import HostError, InputError
from orchestrator.relay.processes import last_lines
from orchestrator.transport import Connector

STRIP_DIR = "relay-strip"
KEEP = ("source_path", "sha256", "bytes", "step", "dropped", "format")


@dataclass
class Stripped:
    folder: str                   # the weights folder on the source host (what is relayed)
    stripped_from: dict | None    # what the payload recorded about the checkpoint
    note: str = ""                # dry run: what would happen


def strip_key(path: str, size: int, mtime_ns: int) -> str:
    """The name of PATH's stripped copy under <workdir>/relay-strip/ (a rewritten checkpoint gets another)."""
    return hashlib.sha256(f"{path}\0{size}\0{mtime_ns}".encode()).hexdigest()[:16]


def strip_on_source(connector: Connector, host_name: str, path: str, wait_stable: float, dry_run: bool,
                    call: Callable[..., Any]) -> Stripped:
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
    cmd = (f"cd {shlex.quote(payload_dir(host.workdir))} && exec {shlex.quote(python)} -m remote_payload "
           f"strip-checkpoint {shlex.quote(path)} {shlex.quote(out_dir)}")
    res = connector.session(host_name).run(cmd, check=False, env=connector.inventory.host_env(host_name) or None)
    if not res.ok:
        errs = [ln for ln in res.err_text.splitlines() if ln.startswith("dfo-payload error:")]
        detail = errs[-1].removeprefix("dfo-payload error:").strip() if errs else last_lines(res.err_text or res.text)
        raise HostError(host_name, f"strip-checkpoint of {path} failed: {detail}")
    record = call(host_name, "_read_json", path=posixpath.join(out_dir, "dfo-source.json"))
    record = record if isinstance(record, dict) else {}
    return Stripped(out_dir, {k: record[k] for k in KEEP if k in record} or None)
