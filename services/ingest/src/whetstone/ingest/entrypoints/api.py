"""OpenAI's Files API, owned by ingest: upload (streamed to S3, validated by the data gate),
list, retrieve with the validation verdict, download, delete (refused while a job uses it)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import iterate_in_threadpool

from whetstone.contracts import (TOLERANT, CostEstimate, DatasetDeletedV1, DatasetStats, DatasetSubmittedV1,
                                 DatasetValidatedV1, ValidationIssue)
from whetstone.runtime.errors import ApiError
from whetstone.runtime.file_ids import file_id_key, mint_file_id
from whetstone.runtime.http import ListPage, list_page, not_found
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.s3 import tenant_prefix
from whetstone.runtime.service import Runtime

from ..adapters.files import (OPENAI_PURPOSE, PLATFORM_PURPOSES, FileStore, MultipartReceiver, UploadRefused,
                             boundary_of, disk_of, safe_filename, sniff_purpose)
from ..adapters.formats import known_suffix
from ..context import IngestContext
from ..domain.files import FileRecord
from ..domain.storage import Disk, Quota, WriteBudget, write_budget

# what a multipart body carries besides the file: part headers, boundaries and the small form fields
MULTIPART_OVERHEAD = 64 << 10
DRAIN_AFTER_REFUSAL = 16 << 20  # read (and drop) this much more so the client sees the answer, not a reset
# the report's findings shown with a file (duplicates, PII, splits, counts per code); the whole report: report_uri
REPORT_STATS = frozenset({"train_rows", "validation_rows", "exact_duplicates", "near_duplicates", "contaminated",
                          "pii_hits", "pii_by_kind", "toxic", "near_dup_clusters", "error_counts", "warning_counts",
                          "tokens_estimated", "trained_tokens"})


class FileValidation(BaseModel):
    """The data gate's verdict shown with a file."""

    model_config = ConfigDict(populate_by_name=True)

    status: str
    format: str | None
    schema_: str | None = Field(default=None, alias="schema")
    rows_total: int
    rows_kept: int
    tokens_total: int | None
    error_count: int
    errors: list[ValidationIssue]
    warnings: list[ValidationIssue]
    report_uri: str | None
    stats: DatasetStats                  # the figures of REPORT_STATS the gate gave
    cost_estimate: CostEstimate | None   # its given fields only, as the dataset.validated event has them


class FileObject(BaseModel):
    """OpenAI's File object, with the platform's dataset purpose and validation verdict."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str
    status_details: str | None
    expires_at: int | None = None
    dataset_purpose: str
    validation: FileValidation | None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def _validation(v: DatasetValidatedV1) -> FileValidation:
    return FileValidation(
        status=v.status, format=v.format, schema_=v.data_schema, rows_total=v.rows_total, rows_kept=v.rows_kept,
        tokens_total=v.tokens_total, error_count=v.error_count, errors=v.errors, warnings=v.warnings,
        report_uri=v.report_uri, cost_estimate=v.cost_estimate,
        stats=DatasetStats.model_validate(v.stats.model_dump(mode="json", include=REPORT_STATS), context=TOLERANT))


def file_object(f: FileRecord) -> FileObject:
    return FileObject(id=f.file_id, bytes=f.bytes, created_at=int(f.created_at.timestamp()), filename=f.filename,
                      purpose=f.purpose, status=f.status, status_details=f.status_details(),
                      dataset_purpose=f.dataset_purpose,
                      validation=_validation(f.validated) if f.validated is not None else None)


def file_not_found(file_id: str) -> ApiError:
    return not_found(f"No such File object: {file_id}", code="file_not_found", param="file_id")


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


async def _receive(request: Request, dest: Path, budget: WriteBudget,
                   remeasure: Callable[[int], WriteBudget] | None = None) -> Any:
    stream = request.stream()
    receiver: MultipartReceiver | None = None
    try:
        declared = _declared_length(request)
        if budget.bytes == 0 or (declared is not None and declared > budget.bytes + MULTIPART_OVERHEAD):
            # refused before a byte is written: no room at all, or a body that cannot fit
            raise UploadRefused(*budget.refusal("the file"), "file")
        receiver = MultipartReceiver(boundary_of(request.headers.get("content-type")), dest, budget, remeasure)
        async for chunk in stream:
            receiver.feed(chunk)
        return receiver.finish()
    except UploadRefused:
        if receiver is not None:
            receiver.close()
        drained = 0
        async for chunk in stream:
            drained += len(chunk)
            if drained > DRAIN_AFTER_REFUSAL:
                break
        raise
    except ValueError as exc:  # malformed multipart
        if receiver is not None:
            receiver.close()
        raise UploadRefused(400, "invalid_multipart", f"the multipart body could not be parsed: {exc}",
                            "file") from exc


def routes(rt: Runtime[IngestContext]) -> APIRouter:
    r = APIRouter(prefix="/v1/files")

    @r.post("")
    async def upload(request: Request, caller: Caller = require("write")) -> FileObject:
        cfg = rt.ctx.config
        quota = cfg.storage_quota_for(caller.tenant_id)
        used = 0
        if quota is not None:
            async with rt.uow() as uow:
                used = await FileStore(uow.conn).bytes_kept(caller.tenant_id)
        # the upload limit, the free space of the disk it is written to and the tenant's quota, whichever is least
        budget = write_budget(cfg.max_upload_bytes, disk_of(cfg.work_dir, cfg.disk_reserve_bytes),
                              Quota(quota, used), limit_name="upload limit")

        def remeasure(written: int) -> WriteBudget:   # the disk again, counting what this upload wrote as room
            now = disk_of(cfg.work_dir, cfg.disk_reserve_bytes)
            return write_budget(cfg.max_upload_bytes, Disk(now.free + written, now.reserve), Quota(quota, used),
                                limit_name="upload limit")

        with tempfile.TemporaryDirectory(prefix="upload-", dir=cfg.work_dir) as tmp:
            got = await _receive(request, Path(tmp) / "file", budget, remeasure)
            if not got.file_parts:
                raise UploadRefused(400, "missing_file", "the multipart body has no `file` part", "file")
            purpose = got.fields.get("purpose", "").strip()
            if purpose not in (OPENAI_PURPOSE, *PLATFORM_PURPOSES):
                raise UploadRefused(400, "invalid_purpose", f"purpose must be `{OPENAI_PURPOSE}` (or one of "
                                    f"{', '.join(PLATFORM_PURPOSES)}), not {purpose[:40]!r}", "purpose")
            if got.size == 0:
                raise UploadRefused(400, "empty_file", "the file is empty", "file")
            filename = safe_filename(got.filename)
            dataset_purpose = purpose if purpose != OPENAI_PURPOSE else sniff_purpose(got.path)
            # every upload its own id and object (deleting one never touches another's); identical content
            # is validated once: a later upload of the same bytes gets the verdict given before
            # (usecases/submissions.py)
            file_id = mint_file_id(caller.tenant_id, file_id_key(rt.settings.data_dir))
            key = f"{tenant_prefix(caller.tenant_id)}uploads/{file_id}{known_suffix(filename)}"
            source_uri = await asyncio.to_thread(rt.store.put_file, key, got.path)
        async with rt.uow() as uow:
            files = FileStore(uow.conn)
            if quota is not None:   # uploads of one tenant that streamed in at once: the quota holds for their sum
                await files.lock_tenant(caller.tenant_id)
                held = Quota(quota, await files.bytes_kept(caller.tenant_id))
                if held.room is not None and got.size > held.room:
                    await asyncio.to_thread(rt.store.delete, source_uri)
                    raise UploadRefused(*write_budget(got.size, Disk(got.size, 0), held).refusal("the file"), "file")
            await files.add(caller.tenant_id, file_id, filename=filename, purpose=purpose,
                            dataset_purpose=dataset_purpose, size=got.size, sha256=got.sha256, source_uri=source_uri,
                            now=rt.clock())
            await uow.publish(DatasetSubmittedV1(dataset_id=file_id, name=filename, source_uri=source_uri,
                                                 purpose=dataset_purpose, size_bytes=got.size),
                              tenant_id=caller.tenant_id)
            record = await files.get(caller.tenant_id, file_id)
            assert record is not None
        rt.log.info("file uploaded", tenant_id=caller.tenant_id, file_id=file_id, bytes=got.size,
                    purpose=dataset_purpose)
        return file_object(record)

    @r.get("")
    async def list_files(caller: Caller = require("read"), purpose: str | None = None, after: str | None = None,
                         limit: int = Query(100, ge=1, le=10_000),
                         order: Literal["asc", "desc"] = "desc") -> ListPage[FileObject]:
        async with rt.uow() as uow:
            rows = await FileStore(uow.conn).list(caller.tenant_id, purpose=purpose, after=after, limit=limit + 1,
                                                  ascending=order == "asc")
        return list_page([file_object(f) for f in rows[:limit]], len(rows) > limit)

    @r.get("/{file_id}")
    async def retrieve(file_id: str, caller: Caller = require("read")) -> FileObject:
        async with rt.uow() as uow:
            record = await FileStore(uow.conn).get(caller.tenant_id, file_id)
        if record is None:
            raise file_not_found(file_id)
        return file_object(record)

    @r.get("/{file_id}/content")
    async def content(file_id: str, caller: Caller = require("read")) -> StreamingResponse:
        async with rt.uow() as uow:
            record = await FileStore(uow.conn).get(caller.tenant_id, file_id)
        if record is None:
            raise file_not_found(file_id)
        # the length of the object as read now: a results file is rewritten when a late step arrives
        body, length = await asyncio.to_thread(rt.store.open_sized, record.source_uri)
        return StreamingResponse(iterate_in_threadpool(body.iter_chunks(1 << 20)),
                                 media_type="application/octet-stream",
                                 headers={"content-length": str(length),
                                          "content-disposition": f'attachment; filename="{record.file_id}"'})

    @r.delete("/{file_id}")
    async def delete(file_id: str, caller: Caller = require("write")) -> FileDeleted:
        async with rt.uow() as uow:
            files = FileStore(uow.conn)
            record = await files.get(caller.tenant_id, file_id)
            if record is None:
                raise file_not_found(file_id)
            using = await files.jobs_using(caller.tenant_id, file_id)
            if using:
                raise ApiError(409, f"File {file_id} is used by job(s) {', '.join(using[:5])}; delete it once they "
                               "finish.", code="file_in_use", param="file_id")
            await files.delete(caller.tenant_id, file_id, rt.clock())
            # the scheduler refuses new jobs on it and fails one whose admission crossed this delete
            await uow.publish(DatasetDeletedV1(dataset_id=file_id), tenant_id=caller.tenant_id)
        try:
            await asyncio.to_thread(rt.store.delete, record.source_uri)
        except Exception as exc:  # the row is gone; a leftover upload object is only storage
            rt.log.warning("upload object not deleted", file_id=file_id, error=str(exc))
        return FileDeleted(id=file_id, deleted=True)

    return r
