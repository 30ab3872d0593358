"""What an upload or an unpack may write (domain/storage.py): the operator's limit, the disk the pod
really has (less the reserve) and the tenant's storage quota, each refused with its own answer; an
archive is unpacked no further than the disk's room (issue 35 point 7)."""

import gzip
from pathlib import Path

import pytest

from whetstone.ingest.adapters.archives import SourceError, unpack
from whetstone.ingest.config import IngestSettings
from whetstone.ingest.domain.storage import Bound, Disk, Quota, write_budget
from whetstone.ingest.usecases.gates import archive_limits

pytestmark = pytest.mark.unit


def test_the_least_bound_sets_the_budget_and_names_itself() -> None:
    roomy = Disk(free=10_000, reserve=1_000)
    assert write_budget(5_000, roomy).bytes == 5_000 and write_budget(5_000, roomy).bound is Bound.LIMIT
    status, code, message = write_budget(5_000, roomy, limit_name="upload limit").refusal("the file")
    assert (status, code) == (413, "file_too_large") and "upload limit of 5000 bytes" in message

    tight = write_budget(5_000, Disk(free=3_000, reserve=1_000))
    assert (tight.bytes, tight.bound) == (2_000, Bound.DISK)
    status, code, message = tight.refusal("the file")
    assert (status, code) == (507, "insufficient_storage")
    assert "3000 bytes free" in message and "1000 are kept in reserve" in message and "2000 bytes" in message
    assert write_budget(5_000, Disk(free=500, reserve=1_000)).bytes == 0   # below the reserve: no room at all

    quota = write_budget(5_000, roomy, Quota(limit=4_000, used=3_500))
    assert (quota.bytes, quota.bound) == (500, Bound.QUOTA)
    status, code, message = quota.refusal("the file")
    assert (status, code) == (413, "storage_quota_exceeded")
    assert "storage quota of 4000 bytes" in message and "3500 bytes" in message and "delete files" in message
    assert write_budget(5_000, roomy, Quota(limit=None, used=10**12)).bound is Bound.LIMIT   # no quota
    assert write_budget(5_000, roomy, Quota(limit=100, used=900)).bytes == 0                 # already over


def test_an_operator_quota_per_tenant_overrides_the_default() -> None:
    s = IngestSettings(storage_quota_bytes=1_000, tenant_storage_quota_bytes={"big": 10**9})
    assert s.storage_quota_for("big") == 10**9 and s.storage_quota_for("small") == 1_000
    assert IngestSettings().storage_quota_for("anyone") is None


def test_an_archive_unpacks_no_further_than_the_disk_allows(tmp_path: Path) -> None:
    packed = tmp_path / "data.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"text": "a line of text"}\n' * 4_000))   # 108,000 bytes unpacked
    s = IngestSettings(max_unpacked_bytes=10**9, max_compression_ratio=10**6)
    # the disk has 100,000 bytes of room past the reserve: the unpack stops there, named as the disk's
    small_disk = archive_limits(s, Disk(free=150_000, reserve=50_000))
    with pytest.raises(SourceError) as refused:
        unpack(packed, "gzip", "data.jsonl.gz", tmp_path / "out", small_disk)
    assert refused.value.issue.code == "insufficient_storage"
    assert "150000 bytes free" in refused.value.issue.message and not (tmp_path / "out").exists()
    # the same archive on a disk with room unpacks whole; the operator's limit still says archive_bomb
    root = unpack(packed, "gzip", "data.jsonl.gz", tmp_path / "ok", archive_limits(s, Disk(free=10**9, reserve=0)))
    assert root.stat().st_size == 108_000
    with pytest.raises(SourceError) as bomb:
        unpack(packed, "gzip", "data.jsonl.gz", tmp_path / "limit",
               archive_limits(IngestSettings(max_unpacked_bytes=50_000, max_compression_ratio=10**6),
                              Disk(free=10**9, reserve=0)))
    assert bomb.value.issue.code == "archive_bomb" and "50000 bytes" in bomb.value.issue.message
