"""A file's validation as the Files API shows it: the gate's headline figures of dataset.validated, typed."""

from datetime import UTC, datetime

import pytest
from whetstone.contracts import DatasetStats, DatasetStatus, DatasetValidatedV1
from whetstone.ingest.domain.files import FileRecord
from whetstone.ingest.entrypoints.api import file_object

pytestmark = pytest.mark.unit


def test_a_file_shows_the_headline_figures_of_its_gate_stats_only():
    stats = DatasetStats(train_rows=9, validation_rows=1, exact_duplicates=2, size_bytes=4096, tokens_estimated=False,
                         roles={"user": 10}, pii_by_kind={"email": 1}, audit_uri="s3://b/audit.jsonl")
    verdict = DatasetValidatedV1(dataset_id="ds-1", version="v", name="a.jsonl", status=DatasetStatus.ACCEPTED,
                                 rows_total=10, rows_kept=10, stats=stats)
    record = FileRecord(tenant_id="t", file_id="file-1", filename="a.jsonl", purpose="fine-tune", dataset_purpose="sft",
                        bytes=4096, sha256="0" * 64, source_uri="s3://b/raw", created_at=datetime.now(UTC),
                        validated=verdict)
    shown = file_object(record).model_dump(mode="json")["validation"]["stats"]
    assert shown == {"train_rows": 9, "validation_rows": 1, "exact_duplicates": 2, "tokens_estimated": False,
                     "pii_by_kind": {"email": 1}}
    assert list(shown) == ["train_rows", "validation_rows", "exact_duplicates", "tokens_estimated", "pii_by_kind"]
