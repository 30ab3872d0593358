"""How many bytes an upload or an unpack may write: the operator's limit, the disk the pod really
has, and the tenant's storage quota. Pure: the caller measures the disk and the tenant's files.

Three bounds, each refused with its own answer (adapters/files.py raises them as the bytes stream in):
* the operator's size limit (`max_upload_bytes`, `max_unpacked_bytes`): 413 `file_too_large`;
* the free space of the disk ingest writes to, less a reserve kept free for the service itself:
  507 `insufficient_storage`, naming what is free;
* the tenant's storage quota (bytes of the files it keeps): 413 `storage_quota_exceeded`, naming the
  quota and what the tenant uses; deleting files frees it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Bound(StrEnum):
    LIMIT = "limit"       # the operator's size limit
    DISK = "disk"         # the free space on ingest's data disk, less the reserve
    QUOTA = "quota"       # the tenant's storage quota


@dataclass(frozen=True)
class Disk:
    """What `shutil.disk_usage` said of a directory's disk, and the part the operator keeps free."""

    free: int
    reserve: int

    @property
    def room(self) -> int:
        return max(0, self.free - self.reserve)


@dataclass(frozen=True)
class Quota:
    """A tenant's storage quota (None: none) and the bytes its files use now."""

    limit: int | None
    used: int

    @property
    def room(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)


@dataclass(frozen=True)
class WriteBudget:
    """The most bytes one write may take, and which bound sets it (the smallest; on a tie the
    operator's limit, then the disk, then the quota)."""

    bytes: int
    bound: Bound
    limit: int
    disk: Disk
    quota: Quota
    limit_name: str = "limit"

    def refusal(self, what: str) -> tuple[int, str, str]:
        """(HTTP status, code, message) for `what` (e.g. "the file") going past this budget."""
        if self.bound is Bound.DISK:
            return (507, "insufficient_storage",
                    f"{what} does not fit on the ingest data disk: {self.disk.free} bytes free, of which "
                    f"{self.disk.reserve} are kept in reserve, leaves room for {self.disk.room} bytes")
        if self.bound is Bound.QUOTA:
            return (413, "storage_quota_exceeded",
                    f"{what} would exceed this tenant's storage quota of {self.quota.limit} bytes ({self.quota.used} "
                    f"bytes in files kept now, room for {self.quota.room} more); delete files to free it")
        return 413, "file_too_large", f"{what} exceeds the {self.limit_name} of {self.limit} bytes"


def write_budget(limit: int, disk: Disk, quota: Quota | None = None, *, limit_name: str = "limit") -> WriteBudget:
    quota = quota or Quota(None, 0)
    candidates = [(limit, Bound.LIMIT), (disk.room, Bound.DISK)]
    if quota.room is not None:
        candidates.append((quota.room, Bound.QUOTA))
    size, bound = min(candidates, key=lambda c: c[0])   # min keeps the first of equal sizes
    return WriteBudget(size, bound, limit, disk, quota, limit_name)
