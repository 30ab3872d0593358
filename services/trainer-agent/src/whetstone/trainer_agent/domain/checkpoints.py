"""Which checkpoints of a job exist, which to keep, which to resume from, which attempt may
write them. Pure.

A job's checkpoints live under ``tenants/<tenant>/jobs/<job>/checkpoints/step-<8 digits>-<kind>-a<attempt>``
(a name without ``-a<attempt>`` reads as attempt 0). Periodic and emergency
checkpoints are resumable trainer states; the final one is the trained artifact (never pruned,
never resumed from). Newest = highest step, at the same step an emergency checkpoint is newer
than a periodic one, then the higher attempt.

Fencing: the job's ``checkpoints/fence.json`` holds the newest attempt that started a segment.
A segment of an older attempt (a node that lost contact while its job moved on) may neither
write nor prune checkpoints; its names carry its attempt, so it never overwrites the new one's.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from whetstone.contracts import CheckpointRef
from whetstone.contracts.base import TOLERANT

KINDS = ("periodic", "emergency", "final")
RESUMABLE = ("periodic", "emergency")
_NAME = re.compile(r"step-(\d{8})-(periodic|emergency|final)(?:-a(\d+))?$")
FENCE = "fence.json"


@dataclass(frozen=True)
class StoredCheckpoint:
    prefix: str      # object key prefix, no trailing slash
    step: int
    kind: str
    attempt: int = 0  # 0: a name without an attempt

    @property
    def resumable(self) -> bool:
        return self.kind in RESUMABLE

    def order(self) -> tuple[int, int, int]:
        return self.step, KINDS.index(self.kind), self.attempt


class StaleAttempt(Exception):
    """A segment of an older attempt tried to write or prune the job's checkpoints."""


@dataclass(frozen=True)
class AttemptFence:
    tenant_id: str
    job_id: str
    attempt: int

    @property
    def key(self) -> str:
        return job_checkpoints_prefix(self.tenant_id, self.job_id) + FENCE

    def check(self, fenced: int | None) -> None:
        """StaleAttempt when the job has moved on to a newer attempt than ours."""
        if fenced is not None and fenced > self.attempt:
            raise StaleAttempt(f"job {self.job_id}: attempt {self.attempt} is stale (attempt {fenced} took over); "
                               "its checkpoints are refused")


def checkpoint_ref(value: CheckpointRef | Mapping[str, Any] | None) -> CheckpointRef | None:
    """A stored checkpoint reference (a jsonb column, an event's field) as the contract's type."""
    if value is None or isinstance(value, CheckpointRef):
        return value
    return CheckpointRef.model_validate(value, context=TOLERANT)


def job_checkpoints_prefix(tenant_id: str, job_id: str) -> str:
    return f"tenants/{tenant_id}/jobs/{job_id}/checkpoints/"


def checkpoint_prefix(tenant_id: str, job_id: str, step: int, kind: str, attempt: int | None = None) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {str(kind)!r}")
    if step < 0:
        raise ValueError(f"negative step {step}")
    if attempt is not None and attempt < 1:
        raise ValueError(f"attempt {attempt} (must be >= 1)")
    suffix = f"-a{attempt}" if attempt is not None else ""
    return f"{job_checkpoints_prefix(tenant_id, job_id)}step-{step:08d}-{kind}{suffix}"


def parse_checkpoint(prefix: str) -> StoredCheckpoint | None:
    prefix = prefix.rstrip("/")
    m = _NAME.search(prefix.rsplit("/", 1)[-1])
    return StoredCheckpoint(prefix, int(m.group(1)), m.group(2), int(m.group(3) or 0)) if m else None


def checkpoints_in(keys: Iterable[str], job_prefix: str) -> list[StoredCheckpoint]:
    """The distinct checkpoints named by a listing of object keys under ``job_prefix``, oldest first."""
    found: dict[str, StoredCheckpoint] = {}
    for key in keys:
        if not key.startswith(job_prefix):
            continue
        head = key[len(job_prefix):].split("/", 1)[0]
        ck = parse_checkpoint(job_prefix + head)
        if ck is not None:
            found[ck.prefix] = ck
    return sorted(found.values(), key=StoredCheckpoint.order)


def to_prune(checkpoints: Iterable[StoredCheckpoint], keep_last: int, protected: Collection[str]) -> list[StoredCheckpoint]:
    """Resumable checkpoints beyond the newest ``keep_last``, except protected prefixes (the one a
    segment resumed from, the newest durable one). Final checkpoints are never pruned."""
    if keep_last < 1:
        raise ValueError("keep_last must be at least 1")
    resumable = sorted((c for c in checkpoints if c.resumable), key=StoredCheckpoint.order, reverse=True)
    keep = {c.prefix for c in resumable[:keep_last]} | {p.rstrip("/") for p in protected}
    return [c for c in reversed(resumable) if c.prefix not in keep]


def resume_candidates(checkpoints: Iterable[StoredCheckpoint], requested: str | None,
                      max_step: int | None = None) -> list[StoredCheckpoint]:
    """Where to resume from, best first: the requested checkpoint, then every older resumable one
    (newest first). Nothing past ``max_step`` (the requested step): a newer checkpoint the
    scheduler never acknowledged may come from a stale segment."""
    cks = [c for c in checkpoints if c.resumable]
    req = requested.rstrip("/") if requested else None
    first = [c for c in cks if c.prefix == req]
    rest = sorted((c for c in cks if c.prefix != req and (max_step is None or c.step <= max_step)),
                  key=StoredCheckpoint.order, reverse=True)
    if first:
        rest = [c for c in rest if c.order() < first[0].order()]
    return first + rest
