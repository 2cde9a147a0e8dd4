"""Merge the per-host parts of a sharded eval into one results.json + samples.jsonl.

Each eval host evaluated its own slice of the prompts with the same settings; the merged results hold
every sample (tagged with its host) and metrics recomputed over all of them, plus per-host provenance
(job, shard, versions, kernel path) so a reader can tell where each number came from.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.errors import OperationError
from orchestrator.core.host_text import decode_json


def _read(part: Path) -> tuple[dict, list[dict]]:
    try:
        results = decode_json((part / "results.json").read_text(encoding="utf-8"))
        samples = [decode_json(line) for line in (part / "samples.jsonl").read_text(encoding="utf-8").splitlines()
                   if line.strip()]
    except (OSError, ValueError) as exc:
        raise OperationError(f"pulled results in {part} are incomplete or unreadable: {exc}") from None
    # The host wrote these files: a malformed one is a clear error, never a traceback.
    if not isinstance(results, dict):
        raise OperationError(f"{part / 'results.json'}: not a JSON object (got {type(results).__name__})")
    for number, line in enumerate(samples, 1):
        if not isinstance(line, dict):
            raise OperationError(f"{part / 'samples.jsonl'}: sample {number} is not a JSON object "
                                 f"(got {type(line).__name__})")
    return results, samples


def merge_host_results(parts: dict[str, Path], jobs: dict[str, dict]) -> tuple[dict, list[dict]]:
    loaded = {host: _read(path) for host, path in parts.items()}
    provenance = {
        host: {"job_id": jobs[host]["job_id"], "shard": jobs[host].get("shard"),
               "samples": len(samples), "versions": results.get("versions"),
               "kernel_path": (results.get("extraction") or {}).get("kernel_path"),
               "timings": results.get("timings")}
        for host, (results, samples) in loaded.items()
    }
    for host, (_, samples) in loaded.items():
        for line in samples:
            line["host"] = host
    if len(loaded) == 1:
        (results, samples), = loaded.values()
        return {**results, "hosts": provenance}, samples
    from remote_payload.errors import PayloadError
    from remote_payload.metrics.aggregate import merge_shards  # pure stdlib: the payload owns its metric definitions

    try:
        results, samples = merge_shards([loaded[h] for h in parts])
    except PayloadError as exc:
        raise OperationError(f"cannot merge the hosts' results: {exc}",
                             hint="the hosts must run the same payload, target and settings") from None
    from remote_payload.cards.explain import merged_card  # the verdict over every host's samples

    try:
        card = merged_card(results, samples)
    except PayloadError as exc:
        raise OperationError(f"cannot recompute the card's verdict over the hosts' samples: {exc}") from None
    if card is not None:
        results["card"] = card
    return {**results, "hosts": provenance}, samples
