"""`dfo watch --drafter-spec FILE`: the drafter spec of checkpoints that carry none.

A trainer that saves bare weights (no 'config' entry in the checkpoint, no spec.json beside it) is stripped into
a folder whose config.json is marked incomplete; the eval then needs the spec sidecar (block_size,
mask_token_id, target_layer_ids, rope_theta). A watch names its drafters after the checkpoints, so the one FILE
is given to each checkpoint's eval under that checkpoint's name (the payload's --drafter-spec NAME=FILE). FILE
is a path on the eval host, where the payload reads it; the watch's pre-flight checks that it is there.
"""

from __future__ import annotations

import posixpath
from dataclasses import replace

from orchestrator.core.errors import InputError
from orchestrator.evaluation.plan import EvalRequest

FLAG = "--drafter-spec"


def check_drafter_spec(path: str | None) -> str | None:
    """The spec file as the watch uses it: an absolute path on the eval host (None when not given)."""
    if path is None:
        return None
    if not path.startswith("/") or "\x00" in path or "\n" in path:
        raise InputError(f"{FLAG} {path!r}: expected an absolute path on the eval host",
                         hint="the spec sidecar (JSON/YAML with block_size, mask_token_id, target_layer_ids, "
                         "rope_theta) is read where the eval runs, e.g. --drafter-spec /data/specs/run7.json")
    return posixpath.normpath(path)


def with_drafter_spec(request: EvalRequest, name: str, spec: str | None) -> EvalRequest:
    """REQUEST with the spec given to its drafter NAME (unchanged without a spec)."""
    if spec is None:
        return request
    return replace(request, payload_args=[*request.payload_args, f"{FLAG}={name}={spec}"])
