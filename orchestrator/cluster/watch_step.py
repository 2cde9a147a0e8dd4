"""`dfo watch --host CLUSTER`: each new checkpoint becomes one Slurm array job on the cluster.

The watch loop runs unchanged: the checkpoint is stripped on the training host and relayed once, through
the controller, to the cluster host's relay folder (on the shared filesystem, so every compute node reads it),
then ``start_eval`` submits the eval as one array of ``--shards`` tasks and ``follow_and_collect`` follows,
merges and records it as `dfo eval --host CLUSTER --shards N` does. The baselines are one such array too.

No resident worker on a cluster by default: between checkpoints it would hold a node's GPUs idle. On the user's
request (`--resident-job`) it is one long-running Slurm job (cluster/resident_job.py).
"""

from __future__ import annotations

from orchestrator.cluster.eval_run import check_cluster_eval
from orchestrator.core.errors import InputError
from orchestrator.core.inventory import Inventory
from orchestrator.evaluation.plan import EvalRequest


def cluster_shards(inventory: Inventory, host: str, shards: int, request: EvalRequest,
                   prompt_count: int | None) -> int | None:
    """The array size of each checkpoint's eval on HOST, or None when HOST is not a cluster (pure). Each
    checkpoint is relayed to the cluster, so its relay folder must lie on the shared filesystem."""
    if inventory.hosts[host].slurm is None:
        if shards != 1:
            raise InputError(f"--shards {shards}: {host} is not a Slurm cluster (no slurm: section in "
                             f"{inventory.source})", hint="--shards is for an eval host with a slurm: section")
        return None
    check_cluster_eval(inventory, host, shards, request, prompt_count, relays=True)
    return shards


def resident_note(host: str) -> str:
    return (f"{host} is a Slurm cluster: one array job per checkpoint, no resident worker (it would hold GPUs "
            "idle between checkpoints; --resident-job asks for one)")
