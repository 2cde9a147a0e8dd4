"""What `dfo inventory check --connect` reports for a cluster: the Slurm version, the partition's state, and
whether the shared folder is visible from a compute node (one tiny job that writes a token there, which the
login node then reads back)."""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import asdict, dataclass

from orchestrator.cluster.operation import LoginSession
from orchestrator.cluster.plan import sbatch_options
from orchestrator.core.slurm_section import SlurmSection

VERSION_RE = re.compile(r"^slurm(?:-wlm)? ([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?:-[0-9A-Za-z.]{1,20})?)\s*\Z")
AVAIL = frozenset({"up", "down", "drain", "inact"})


@dataclass(frozen=True)
class ClusterFacts:
    version: str | None            # None: sbatch missing or its answer not a version
    partition: str                 # the partition asked for ("(default)" when the section names none)
    partition_state: str | None    # up / down / drain / inact; None: unknown partition
    shared_visible: bool | None    # None: not probed (the partition is not up, or asked not to)
    detail: str = ""               # why a check failed, in one line

    def as_dict(self) -> dict:
        return asdict(self)


def probe_cluster(session: LoginSession, section: SlurmSection, *, compute_probe: bool = True,
                  wait_s: int = 120) -> ClusterFacts:
    version_reply = session.run(["sbatch", "--version"], check=False)
    match = VERSION_RE.match(version_reply.text.strip()) if version_reply.exit_code == 0 else None
    partition = section.partition or "(default)"
    if not match:
        return ClusterFacts(None, partition, None, None, "sbatch is not on the login node's PATH")
    sinfo = ["sinfo", "-h", "-o", "%a"] + (["-p", section.partition] if section.partition else [])
    states = {line.strip() for line in session.run(sinfo, check=False).text.splitlines() if line.strip()}
    state = next(iter(states)) if len(states) == 1 and states <= AVAIL else None
    if state is None:
        return ClusterFacts(match.group(1), partition, None, None, f"sinfo knows no partition {partition}")
    if state != "up" or not compute_probe:
        return ClusterFacts(match.group(1), partition, state, None,
                            "" if state == "up" else f"partition {partition} is {state}: jobs will stay pending")
    return ClusterFacts(match.group(1), partition, state, *_shared_visible(session, section, wait_s))


def _shared_visible(session: LoginSession, section: SlurmSection, wait_s: int) -> tuple[bool, str]:
    """One short job (sbatch --wait) writes a random token into the shared folder; the login node reads it."""
    token = secrets.token_hex(8)
    path = f"{section.shared}/.dfo-probe-{token}"
    options = [o for o in sbatch_options(section) if not o.startswith("--time=")]
    argv = ["timeout", str(int(wait_s)), "sbatch", "--wait", "--quiet", "--job-name=dfo-probe", "--time=1",
            "--output=/dev/null", *options, f"--wrap=echo {token} > {shlex.quote(path)}"]
    done = session.run(argv, check=False)
    seen = session.run(["cat", path], check=False)
    session.run(["rm", "-f", "--", path], check=False)
    if seen.exit_code == 0 and seen.text.strip() == token:
        return True, ""
    if done.exit_code == 124:
        return False, f"the probe job did not finish within {wait_s} s (queue wait?)"
    return False, (f"a compute node could not write to {section.shared} (probe job exited {done.exit_code})"
                   if done.exit_code else f"{section.shared} is not the same folder on the compute node")
