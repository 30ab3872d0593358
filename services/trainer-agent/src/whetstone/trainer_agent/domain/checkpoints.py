"""Which checkpoints of a job exist, which to keep, which to resume from. Pure.

A job's checkpoints live under ``tenants/<tenant>/jobs/<job>/checkpoints/step-<8 digits>-<kind>``.
Periodic and emergency checkpoints are resumable trainer states; the final one is the
trained artifact (never pruned, never resumed from). Newest = highest step, and at the
same step an emergency checkpoint is newer than a periodic one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

KINDS = ("periodic", "emergency", "final")
RESUMABLE = ("periodic", "emergency")
_NAME = re.compile(r"step-(\d{8})-(periodic|emergency|final)$")


@dataclass(frozen=True)
class StoredCheckpoint:
    prefix: str      # object key prefix, no trailing slash
    step: int
    kind: str

    @property
    def resumable(self) -> bool:
        return self.kind in RESUMABLE

    def order(self) -> tuple[int, int]:
        return self.step, KINDS.index(self.kind)


def job_checkpoints_prefix(tenant_id: str, job_id: str) -> str:
    return f"tenants/{tenant_id}/jobs/{job_id}/checkpoints/"


def checkpoint_prefix(tenant_id: str, job_id: str, step: int, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}")
    if step < 0:
        raise ValueError(f"negative step {step}")
    return f"{job_checkpoints_prefix(tenant_id, job_id)}step-{step:08d}-{kind}"


def parse_checkpoint(prefix: str) -> StoredCheckpoint | None:
    prefix = prefix.rstrip("/")
    m = _NAME.search(prefix.rsplit("/", 1)[-1])
    return StoredCheckpoint(prefix, int(m.group(1)), m.group(2)) if m else None


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
