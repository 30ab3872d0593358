"""A file of the Files API as ingest keeps it, and what its status says. Pure.

A file's id (one per upload, `file-…`, runtime/file_ids.py) is its dataset id, which a job's
`training_file` takes; `validated` is the data gate's verdict on it, once given."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from whetstone.contracts import DatasetStatus, DatasetValidatedV1

RESULTS_FILE_PURPOSE = "fine-tune-results"
STATUS_DETAIL_ERRORS = 20


class FileStatus(StrEnum):
    """OpenAI's file statuses."""

    UPLOADED = "uploaded"
    PROCESSED = "processed"
    ERROR = "error"


@dataclass(frozen=True)
class FileRecord:
    tenant_id: str
    file_id: str
    filename: str
    purpose: str
    dataset_purpose: str
    bytes: int
    sha256: str
    source_uri: str
    created_at: datetime
    validated: DatasetValidatedV1 | None     # the verdict, once the data gate gave one

    @property
    def status(self) -> FileStatus:
        if self.purpose == RESULTS_FILE_PURPOSE:   # made by the platform (usecases/results.py): never validated
            return FileStatus.PROCESSED
        if self.validated is None:
            return FileStatus.UPLOADED
        return FileStatus.PROCESSED if self.validated.status == DatasetStatus.ACCEPTED else FileStatus.ERROR

    def status_details(self) -> str | None:
        """The errors of a rejected file, a line each (the first few), as OpenAI's `status_details`."""
        if self.status != FileStatus.ERROR or self.validated is None:
            return None
        v = self.validated
        lines = [(f"line {e.line}: " if e.line else "") + e.message for e in v.errors[:STATUS_DETAIL_ERRORS]]
        more = (v.error_count or len(v.errors)) - len(lines)
        return "; ".join(lines) + (f"; and {more} more" if more > 0 else "")
