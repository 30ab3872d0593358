"""Which training files a job may name: pure rules over what the scheduler knows of a file
(projected from dataset.submitted / dataset.validated / dataset.deleted)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from whetstone.contracts.estimates import CostEstimate
from whetstone.contracts.events import ValidationIssue

from .jobs import Rejection

FILE_PARAM = "training_file"


@dataclass(frozen=True)
class DatasetRecord:
    """A dataset's validation verdict as the scheduler projected it from `dataset.validated`."""

    dataset_id: str
    version: str
    status: Literal["accepted", "rejected"]
    purpose: str
    data_schema: str | None
    train_uri: str | None
    validation_uri: str | None
    rows_kept: int                      # training examples kept (0 when not counted)
    tokens_total: int | None
    errors: tuple[ValidationIssue, ...]
    cost_estimate: CostEstimate | None   # ingest's estimate, echoed into the job's cost
    image_rows: int                     # examples with images

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"


@dataclass(frozen=True)
class FileFacts:
    """What the scheduler knows of a `training_file` for the tenant creating the job."""

    file_id: str
    status: str | None      # the validation verdict (accepted | rejected), None while unknown
    errors: Sequence[ValidationIssue]
    submitted: bool         # dataset.submitted seen: the verdict will come
    deleted: bool           # dataset.deleted seen
    minted: bool            # a file id the Files API minted for this tenant (runtime/file_ids.py)


def rejected_reasons(errors: Sequence[ValidationIssue]) -> str:
    """The first five validation errors, each with its line when known."""
    return "; ".join(f"line {e.line}: {e.message}" if e.line else e.message for e in errors[:5])


def refusal(f: FileFacts, param: str = FILE_PARAM) -> Rejection | None:
    """Why a job cannot be created on this file, or None (trainable, or its verdict is still to come).
    `param` is the create field that names the file (`training_file` or `validation_file`): the
    rejection's code and message name it (`<param>_deleted`, `invalid_<param>`, `<param>_not_found`).

    A content-addressed `ds-` id that nobody submitted yet may be on its way (an external producer
    publishes dataset.submitted itself): its job waits, and fails after a grace if it never comes."""
    name = f.file_id
    if f.deleted:
        return Rejection(f"{param}_deleted", f"{param} {name!r} was deleted: upload the data again "
                         "(POST /v1/files) and use the new file id", param)
    if f.status is not None and f.status != "accepted":
        return Rejection(f"invalid_{param}", f"{param} {name!r} was rejected by validation: "
                         f"{rejected_reasons(f.errors)}", param)
    if f.status is None and not f.submitted and not f.minted and not name.startswith("ds-"):
        return Rejection(f"{param}_not_found", f"{param} {name!r} is not a file of this organization: "
                         "upload it first (POST /v1/files or whet files upload) and use the id it returns",
                         param)
    return None
