"""What one look at the training folder leads to (pure: listing + series state + options in, plan out).

A checkpoint is *settled* when the training host's clock says its size and mtime have been quiet for
``settle`` seconds (a directory: its newest file). A settled checkpoint that is not yet in the series is
evaluated, subject to ``every`` (only steps that are multiples of N) or ``newest`` (only the newest one).
A checkpoint that failed is tried again if the trainer rewrote it since (other size or mtime), and, with
``retry_failed`` N (``--retry-failed N``), on each later look until it has had N attempts more than its first
(a host that was down, a relay cut off: failures that need no new checkpoint to pass). The
relay's own source-change check backs this up: a file that changes while it is read stops the relay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.core.errors import InputError
from orchestrator.watch.discovery import Checkpoint, Listing

MAX_RETRIES = 100


@dataclass(frozen=True)
class Options:
    settle: float = 30.0
    every: int | None = None
    newest: bool = False
    retry_failed: int = 0  # attempts a failed, unchanged checkpoint gets after its first

    def __post_init__(self):
        if not 0 <= self.retry_failed <= MAX_RETRIES:
            raise InputError(f"--retry-failed {self.retry_failed}: expected 0 to {MAX_RETRIES} retries")
        if self.settle < 0:
            raise InputError("--settle must be 0 or more seconds")
        if self.every is not None and self.every < 1:
            raise InputError("--every must be at least 1")
        if self.every is not None and self.newest:
            raise InputError("--every and --newest exclude each other")


@dataclass
class RoundPlan:
    reattach: list[dict] = field(default_factory=list)      # series entries whose eval job may still run
    evaluate: list[Checkpoint] = field(default_factory=list)
    waiting: list[tuple[Checkpoint, str]] = field(default_factory=list)
    skipped: list[tuple[Checkpoint, str]] = field(default_factory=list)
    done: int = 0

    def as_dict(self) -> dict:
        return {"reattach": [e["name"] for e in self.reattach],
                "evaluate": [{"name": c.name, "step": c.step, "step_source": c.step_source} for c in self.evaluate],
                "waiting": [{"name": c.name, "step": c.step, "why": why} for c, why in self.waiting],
                "skipped": [{"name": c.name, "step": c.step, "why": why} for c, why in self.skipped],
                "done": self.done}


def may_retry(entry: dict, options: Options) -> bool:
    """Whether a failed checkpoint gets another attempt: fewer attempts so far than 1 + --retry-failed."""
    attempts = entry.get("attempts")
    done = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 1
    return done <= options.retry_failed


def quiet_for(ckpt: Checkpoint, host_now: float) -> float:
    return host_now - ckpt.mtime


def plan_round(listing: Listing, entries: dict[str, dict], options: Options) -> RoundPlan:
    """``entries``: the series' checkpoint entries by name."""
    plan = RoundPlan(reattach=[e for e in entries.values() if e["status"] == "evaluating"])
    candidates: list[Checkpoint] = []
    for c in listing.checkpoints:
        e = entries.get(c.name)
        if e and e["status"] == "done":
            plan.done += 1
            continue
        if e and e["status"] == "evaluating":
            continue  # reattached above
        if e and e["status"] == "failed" and e.get("observed") == c.observed and not may_retry(e, options):
            spent = f"; its {options.retry_failed} retries are spent" if options.retry_failed else ""
            plan.skipped.append((c, f"failed before and unchanged since{spent}: {e.get('error', '?')}"))
            continue
        if options.every and c.step % options.every:
            plan.skipped.append((c, f"step {c.step} is not a multiple of --every {options.every}"))
            continue
        if c.size <= 0:
            plan.waiting.append((c, "empty so far"))
            continue
        quiet = quiet_for(c, listing.host_now)
        if quiet < options.settle:
            plan.waiting.append((c, f"written {max(quiet, 0):.0f}s ago; waiting for {options.settle:g}s of quiet"))
            continue
        candidates.append(c)
    if options.newest and candidates:
        newest = candidates[-1]
        done_steps = [c.step for c in listing.checkpoints if (entries.get(c.name) or {}).get("status") == "done"]
        if done_steps and max(done_steps) > newest.step:
            candidates = []  # something newer is already evaluated
        else:
            plan.skipped.extend((c, f"older than the newest settled checkpoint {newest.name}") for c in candidates[:-1])
            candidates = [newest]
    plan.evaluate = candidates
    return plan
