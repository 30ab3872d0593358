"""The Files API's storage: file rows (ingest's schema) as `domain.files.FileRecord`, the streamed
multipart receiver, and which jobs use a file."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header

from whetstone.contracts import DatasetValidatedV1
from whetstone.runtime.errors import ApiError

from ..domain.files import RESULTS_FILE_PURPOSE, FileRecord
from ..domain.layouts import choose
from ..domain.schemas import PURPOSES, default_purpose
from ..domain.storage import Disk, WriteBudget, write_budget

OPENAI_PURPOSE = "fine-tune"
PLATFORM_PURPOSES = PURPOSES   # the platform's own purposes, sent instead of OpenAI's "fine-tune"
MAX_FIELD_BYTES = 4096
SNIFF_BYTES = 1 << 20


class UploadRefused(ApiError):
    """An upload the Files API refuses: raised while the body streams in, rendered by the runtime's
    error handlers like any ApiError (the route drains the rest of the body first)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(status, message, code=code, param=param)


@dataclass
class Received:
    path: Path
    size: int = 0
    sha256: str = ""
    filename: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    file_parts: int = 0


class MultipartReceiver:
    """Feeds the request body, chunk by chunk, through a streaming multipart parser: the `file`
    part goes to `dest` (hashed on the way) and never into memory; past the budget's bytes (an int:
    the operator's limit alone) it stops with the budget's refusal (too large, disk full, quota).
    With `remeasure`, the budget is measured again every `recheck_bytes` written (given the bytes
    written so far): other uploads filling the same disk meanwhile shrink it."""

    def __init__(self, boundary: bytes, dest: Path, limit: int | WriteBudget,
                 remeasure: Callable[[int], WriteBudget] | None = None, recheck_bytes: int = 64 << 20) -> None:
        self.result = Received(dest)
        self.budget = limit if isinstance(limit, WriteBudget) else write_budget(limit, Disk(free=limit, reserve=0),
                                                                                     limit_name="upload limit")
        self._remeasure, self._recheck_bytes, self._next_check = remeasure, recheck_bytes, recheck_bytes
        self._hash = hashlib.sha256()
        self._out = None
        self._headers: dict[bytes, bytes] = {}
        self._hname, self._hvalue = b"", b""
        self._field: str | None = None
        self._value = bytearray()
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._begin, "on_header_field": self._header_field,
            "on_header_value": self._header_value, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done, "on_part_data": self._data, "on_part_end": self._end})

    def _begin(self) -> None:
        self._headers, self._field, self._value = {}, None, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._hname += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._hvalue += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._hname.lower()] = self._hvalue
        self._hname, self._hvalue = b"", b""

    def _headers_done(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        if name == "file":
            if self.result.file_parts:
                raise UploadRefused(400, "invalid_file", "send exactly one `file` part", "file")
            self.result.file_parts += 1
            self.result.filename = params.get(b"filename", b"").decode("utf-8", "replace") or None
            self._out = open(self.result.path, "wb")  # noqa: SIM115 - closed in _end / close()
        self._field = name

    def _data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._out is not None:
            self.result.size += len(chunk)
            if self._remeasure is not None and self.result.size >= self._next_check:
                self.budget = self._remeasure(self.result.size)
                self._next_check = self.result.size + self._recheck_bytes
            if self.result.size > self.budget.bytes:
                raise UploadRefused(*self.budget.refusal("the file"), "file")
            self._hash.update(chunk)
            self._out.write(chunk)
        else:
            self._value += chunk
            if len(self._value) > MAX_FIELD_BYTES:
                raise UploadRefused(400, "field_too_large", f"form field `{self._field}` is too long", self._field)

    def _end(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
        elif self._field:
            self.result.fields[self._field] = self._value.decode("utf-8", "replace")

    def feed(self, chunk: bytes) -> None:
        self.parser.write(chunk)

    def finish(self) -> Received:
        self.parser.finalize()
        self.close()
        self.result.sha256 = self._hash.hexdigest()
        return self.result

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


def disk_of(directory: Path | None, reserve: int) -> Disk:
    """The free space of the disk `directory` (default: the system temp directory) lies on."""
    return Disk(free=shutil.disk_usage(directory or tempfile.gettempdir()).free, reserve=reserve)


def boundary_of(content_type: str | None) -> bytes:
    ctype, params = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data" or not params.get(b"boundary"):
        raise UploadRefused(400, "invalid_content_type", "upload a file as multipart/form-data with a `file` part "
                            "and `purpose`", "file")
    return params[b"boundary"]


def sniff_purpose(path: Path) -> str:
    """OpenAI's `fine-tune` covers several formats: the layout the gate reads the first row as says
    which one (preference -> dpo, text -> cpt, anything else -> sft)."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    for line in head.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return "sft"  # not JSONL (csv, parquet, archives): the data gate detects and reports it
        layout = choose(row, None, None).layout if isinstance(row, dict) else None
        return default_purpose(layout.schema).value if layout else "sft"
    return "sft"


def safe_filename(name: str | None) -> str:
    base = (name or "upload.jsonl").replace("\\", "/").rsplit("/", 1)[-1].strip() or "upload.jsonl"
    return "".join(ch for ch in base if ch.isprintable())[:255] or "upload.jsonl"


# ----------------------------------------------------------------------------- rows

FILE_COLUMNS = """f.tenant_id, f.file_id, f.filename, f.purpose, f.dataset_purpose, f.bytes, f.sha256, f.source_uri,
    f.created_at, dv.validated"""


def _file_from_row(row: asyncpg.Record) -> FileRecord:
    fields = dict(row)
    validated = fields.pop("validated")   # jsonb, decoded by the runtime's pool codec
    return FileRecord(**fields, validated=DatasetValidatedV1.model_validate(validated) if validated else None)


class FileStore:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def add(self, tenant_id: str, file_id: str, *, filename: str, purpose: str, dataset_purpose: str,
                  size: int, sha256: str, source_uri: str, now: datetime) -> None:
        """One upload, under its own new id (identical bytes uploaded twice are two files)."""
        await self.conn.execute(
            "INSERT INTO files (tenant_id, file_id, filename, purpose, dataset_purpose, bytes, sha256, source_uri,"
            " created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)",
            tenant_id, file_id, filename, purpose, dataset_purpose, size, sha256, source_uri, now)

    async def get(self, tenant_id: str, file_id: str) -> FileRecord | None:
        row = await self.conn.fetchrow(
            f"SELECT {FILE_COLUMNS} FROM files f LEFT JOIN dataset_versions dv"
            " ON dv.tenant_id = f.tenant_id AND dv.dataset_id = f.file_id"
            " WHERE f.tenant_id = $1 AND f.file_id = $2 AND f.deleted_at IS NULL", tenant_id, file_id)
        return _file_from_row(row) if row is not None else None

    async def list(self, tenant_id: str, *, purpose: str | None, after: str | None, limit: int,
                   ascending: bool) -> list[FileRecord]:
        cursor = None
        if after:
            cursor = await self.conn.fetchrow("SELECT created_at, file_id FROM files WHERE tenant_id = $1"
                                              " AND file_id = $2", tenant_id, after)
        op, order = (">", "ASC") if ascending else ("<", "DESC")
        where = ["f.tenant_id = $1", "f.deleted_at IS NULL", "($2::text IS NULL OR f.purpose = $2)"]
        args: list[Any] = [tenant_id, purpose, limit]
        if cursor is not None:
            where.append(f"(f.created_at, f.file_id) {op} ($4, $5)")
            args += list(cursor)   # created_at, file_id
        rows = await self.conn.fetch(
            f"SELECT {FILE_COLUMNS} FROM files f LEFT JOIN dataset_versions dv"
            " ON dv.tenant_id = f.tenant_id AND dv.dataset_id = f.file_id"
            f" WHERE {' AND '.join(where)} ORDER BY f.created_at {order}, f.file_id {order} LIMIT $3", *args)
        return [_file_from_row(row) for row in rows]

    async def lock_tenant(self, tenant_id: str) -> None:
        """Until the transaction ends: the tenant's uploads are counted against its quota one at a time."""
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('ingest-files:' || $1))", tenant_id)

    async def bytes_kept(self, tenant_id: str) -> int:
        """The bytes of the files the tenant uploaded and has not deleted (its storage quota's use; the
        results files the platform writes for its jobs do not count)."""
        used = await self.conn.fetchval(
            "SELECT COALESCE(SUM(bytes), 0) FROM files WHERE tenant_id = $1 AND deleted_at IS NULL AND purpose <> $2",
            tenant_id, RESULTS_FILE_PURPOSE)
        return int(used)

    async def jobs_using(self, tenant_id: str, file_id: str) -> list[str]:
        rows = await self.conn.fetch("SELECT job_id FROM file_usage WHERE tenant_id = $1 AND file_id = $2"
                                     " AND ended_at IS NULL ORDER BY job_id", tenant_id, file_id)
        return [job_id for (job_id,) in rows]

    async def delete(self, tenant_id: str, file_id: str, now: datetime) -> bool:
        done = await self.conn.execute("UPDATE files SET deleted_at = $3 WHERE tenant_id = $1 AND file_id = $2"
                                       " AND deleted_at IS NULL", tenant_id, file_id, now)
        return done.endswith(" 1")

    async def job_started_using(self, tenant_id: str, file_id: str, job_id: str, now: datetime) -> None:
        await self.conn.execute(
            "INSERT INTO file_usage (tenant_id, file_id, job_id, since) VALUES ($1,$2,$3,$4)"
            " ON CONFLICT (tenant_id, file_id, job_id) DO NOTHING", tenant_id, file_id, job_id, now)

    async def job_ended(self, tenant_id: str, job_id: str, now: datetime) -> None:
        await self.conn.execute("UPDATE file_usage SET ended_at = $3 WHERE tenant_id = $1 AND job_id = $2"
                                " AND ended_at IS NULL", tenant_id, job_id, now)
