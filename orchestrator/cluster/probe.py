"""What `dfo inventory check --connect` reports for a cluster: the Slurm version, the partition's state and GPUs
per node, and whether the shared folder is visible from a compute node (one tiny job that writes a token there,
which the login node then reads back). The commands run in ``host_script.probe`` on the login node; this module
types their answers and draws the conclusions."""

from __future__ import annotations

import re
import secrets
from dataclasses import asdict, dataclass

from orchestrator.cluster.operation import LoginSession, call, refusal_reason
from orchestrator.cluster.plan import sbatch_options
from orchestrator.cluster.replies import CommandReply, command_reply
from orchestrator.core.errors import HostError
from orchestrator.core.slurm_section import SlurmSection

VERSION_RE = re.compile(r"^slurm(?:-wlm)? ([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?:-[0-9A-Za-z.]{1,20})?)\s*\Z")
AVAIL = frozenset({"up", "down", "drain", "inact"})
# One GPU entry of sinfo's %G (GRES per node): gpu:COUNT or gpu:TYPE:COUNT, maybe with a socket list "(S:0-1)".
GPU_GRES_RE = re.compile(r"^(gpu(?::[A-Za-z0-9_.-]{1,40})?:[0-9]{1,4})(?:\(S:[0-9,-]{1,40}\))?\Z")


@dataclass(frozen=True)
class ClusterFacts:
    version: str | None            # None: sbatch missing or its answer not a version
    partition: str                 # the partition asked for ("(default)" when the section names none)
    partition_state: str | None    # up / down / drain / inact; None: unknown partition
    shared_visible: bool | None    # None: not probed (the partition is not up, or asked not to)
    detail: str = ""               # why a check failed, in one line
    gpus: str | None = None        # the partition's GPUs per node ("gpu:2", "gpu:a100:4, gpu:h100:8"; "" none)

    def as_dict(self) -> dict:
        return asdict(self)


def probe_cluster(session: LoginSession, section: SlurmSection, *, compute_probe: bool = True,
                  wait_s: int = 120) -> ClusterFacts:
    token = secrets.token_hex(8) if compute_probe else ""
    options = [o for o in sbatch_options(section) if not o.startswith("--time=")]
    facts = call(session, "probe", partition=section.partition, options=options, shared=section.shared,
                 token=token, wait_s=int(wait_s), timeout=wait_s + 60)
    if not isinstance(facts, dict):
        raise HostError(session.name, "cluster.probe: the answer is not an object")
    version_reply = command_reply(session.name, "sbatch --version", facts.get("version"))
    match = VERSION_RE.match(version_reply.out.strip()) if version_reply.exit_code == 0 else None
    partition = section.partition or "(default)"
    if not match:
        return ClusterFacts(None, partition, None, None, "sbatch is not on the login node's PATH")
    sinfo = command_reply(session.name, "sinfo", facts.get("sinfo"))
    states = {line.strip() for line in sinfo.out.splitlines() if line.strip()}
    state = next(iter(states)) if len(states) == 1 and states <= AVAIL else None
    if state is None:
        return ClusterFacts(match.group(1), partition, None, None, f"sinfo knows no partition {partition}")
    gpus = partition_gpus(command_reply(session.name, "sinfo %G", facts.get("gres")))
    if state != "up" or not compute_probe:
        return ClusterFacts(match.group(1), partition, state, None,
                            "" if state == "up" else f"partition {partition} is {state}: jobs will stay pending", gpus)
    done = command_reply(session.name, "the probe job", facts.get("job"))
    seen = facts.get("seen")
    if isinstance(seen, str) and seen == token:
        return ClusterFacts(match.group(1), partition, state, True, gpus=gpus)
    if done.exit_code not in (0, 124) and "sbatch: error" in done.err:
        # sbatch itself refused the job (e.g. more GPUs than a node has): the shared folder was not probed.
        return ClusterFacts(match.group(1), partition, state, None,
                            f"sbatch refused the probe job: {refusal_reason(done.err)}", gpus)
    if done.exit_code == 124:
        detail = f"the probe job did not finish within {wait_s} s (queue wait?)"
    elif done.exit_code:
        detail = f"a compute node could not write to {section.shared} (probe job exited {done.exit_code})"
    else:
        detail = f"{section.shared} is not the same folder on the compute node"
    return ClusterFacts(match.group(1), partition, state, False, detail, gpus)


def partition_gpus(reply: CommandReply) -> str | None:
    """The distinct GPU entries of sinfo's %G lines (``gpu:2``, ``gpu:a100:4``), joined; "" when the partition
    has none; None when sinfo failed. Anything else on a line (other resources, odd text) is left out."""
    if reply.exit_code != 0:
        return None
    found: set[str] = set()
    for line in reply.out.splitlines()[:1000]:
        for entry in line.strip().split(","):
            match = GPU_GRES_RE.match(entry.strip())
            if match:
                found.add(match.group(1))
    return ", ".join(sorted(found))
