"""The steps that put an eval's inputs in place on its hosts, before any job starts: relay the drafters that live
elsewhere, upload the prompts and the dataset rows read here (temporary name, verified, renamed). Shared by
`dfo eval` (operation.py) and `dfo watch`'s resident worker (watch/resident.py), which prepares its own eval
step; kept apart from operation.py so that neither imports the other's whole feature.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import posixpath
import secrets
from pathlib import Path
from typing import Any, Mapping

from orchestrator.core.errors import HostError, OperationError
from orchestrator.core.events import Events
from orchestrator.evaluation.plan import EvalPlan
from orchestrator.relay.operation import RelayOptions, relay
from orchestrator.relay.strip import Stripper
from orchestrator.transport import Connector, HostOutcome, for_each_host, hostcall

HOST_SCRIPT = Path(__file__).with_name("host_script.py")


def raise_failures(what: str, outcomes: Mapping[str, HostOutcome[Any]]) -> None:
    errors = [o.error for o in outcomes.values() if o.error is not None]
    if errors:
        hints = [e.hint for e in errors if e.hint]
        raise OperationError(f"{what} failed:\n" + "\n".join(f"  {e.message}" for e in errors),
                             hint="; ".join(hints) or None)


def relay_drafters(connector: Connector, plan: EvalPlan, events: Events,
                    stripper: Stripper | None = None) -> list[dict]:
    done = []
    for step in plan.relays:
        events.step(f"relay drafter '{step.drafter}': {step.source} → {step.destination}"
              + (" (optimizer state stripped on the source)" if step.strip else ""))
        options = RelayOptions(strip_optimizer=step.strip, stripper=stripper)
        result = relay(connector, step.source, step.destination, options, events=events)
        summary = result.as_dict()
        events.info(f"  {summary['sent_bytes']:,} B sent, {summary['skipped_bytes']:,} B already there, "
                      f"{summary['seconds']:.1f}s")
        done.append({"drafter": step.drafter, **summary})
    return done


def upload_prompts(connector: Connector, plan: EvalPlan, local: Path) -> None:
    data = local.read_bytes()
    digest = hashlib.sha256(data).hexdigest()

    def put(host: str) -> None:
        job = next(j for j in plan.jobs if j.host == host)
        put_file(connector, host, data, digest, job.prompts_upload or "", "the prompts file")  # only hosts with one

    raise_failures("prompts upload", for_each_host([j.host for j in plan.jobs if j.prompts_upload], put))


def upload_datasets(connector: Connector, plan: EvalPlan) -> None:
    """The dataset files read here (rows a package ships) to each eval host, under their content names."""
    def put(host: str) -> None:
        job = next(j for j in plan.jobs if j.host == host)
        for local, remote in job.uploads:
            data = Path(local).read_bytes()
            put_file(connector, host, data, hashlib.sha256(data).hexdigest(), remote, "the dataset file")

    raise_failures("dataset upload", for_each_host([j.host for j in plan.jobs if j.uploads], put))


def put_file(connector: Connector, host: str, data: bytes, digest: str, remote: str, what: str) -> None:
    session = connector.session(host)
    folder, name = posixpath.split(remote)
    python = connector.inventory.hosts[host].python
    hostcall.call(session, HOST_SCRIPT, "make_folder", python=python, path=folder)
    # Someone else who can write the folder cannot choose what the upload writes through: the temporary
    # name is fresh and created exclusively (O_CREAT|O_EXCL fails on any existing name, a planted link
    # too), and rename(2) replaces whatever is at REMOTE (a link included) instead of writing through it.
    tmp = posixpath.join(folder, f".{name}.{secrets.token_hex(8)}.dfo-tmp")
    renamed = False
    try:
        with session.sftp.open(tmp, "wx") as fh:
            fh.set_pipelined(True)
            fh.write(data)
        if hostcall.call(session, HOST_SCRIPT, "file_sha256", python=python, path=tmp) != digest:
            raise HostError(host, f"{what} {remote} failed sha256 verification after upload")
        session.sftp.posix_rename(tmp, remote)
        renamed = True
    except OSError as exc:
        raise HostError(host, f"uploading {what} to {remote} failed: {exc}") from None
    finally:
        if not renamed:  # nothing partial left behind
            with contextlib.suppress(Exception):
                session.sftp.remove(tmp)


def jsonable(data):
    return json.loads(json.dumps(data, default=str))
