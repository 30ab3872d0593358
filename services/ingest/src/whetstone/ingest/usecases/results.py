"""Results files (OpenAI's `result_files`), built by ingest from the bus: job.progress and checkpoint.written
give each step's figures (kept in ingest's own table), and the end of training (job.completed, or a
job.failed that comes first) turns them into a CSV in the tenant's prefix, a file of the tenant's with
purpose `fine-tune-results`, announced as file.created for the scheduler to list in the job's
`result_files`. Ingest builds it because files are ingest's: listing, retrieval, content and deletion
then work as for any file. A cancelled job makes none (the cancel voids the job). A job that asked for
W&B gets its offline run as a second result file once the CSV is made (`wandb_runs.py`)."""

from __future__ import annotations

import asyncio
import hashlib

from whetstone.contracts import FileCreatedV1, result_file_id_for
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import tenant_prefix
from whetstone.runtime.service import Runtime

from ..adapters.files import FileStore
from ..adapters.results import ResultsStore
from ..context import IngestContext
from ..domain.results import RESULTS_PURPOSE, results_csv, results_filename
from . import wandb_runs

Rt = Runtime[IngestContext]


async def record(rt: Rt, uow: UnitOfWork, tenant_id: str, job_id: str, step: int, attempt: int | None,
                 values: dict[str, float]) -> None:
    """Keep a step's figures. Topics are not ordered with each other: a report read after the end of
    training (the file made already) rewrites the file in place, the first one after an end of training
    that found no figures makes the file; one after a cancel is dropped."""
    results = ResultsStore(uow.conn)
    state = await results.state(tenant_id, job_id)
    if not values or state == "cancelled":
        return
    await results.record(tenant_id, job_id, step, attempt or 1, values)
    if state == "made":
        await write_results(rt, results, tenant_id, job_id, rewrite=True)
        await wandb_runs.steps_changed(rt, uow, tenant_id, job_id)
    elif await results.ended(tenant_id, job_id):
        await make_results_file(rt, uow, tenant_id, job_id)


async def write_results(rt: Rt, results: ResultsStore, tenant_id: str, job_id: str, *,
                        rewrite: bool = False) -> tuple[str, str, int, str] | None:
    """The CSV written to the tenant's prefix: (file id, uri, size, sha256); None when the job reported no
    step (or, rewriting, when the tenant deleted the file)."""
    rows = await results.rows(tenant_id, job_id)
    if not rows:
        return None
    body = results_csv(rows).encode()
    sha256 = hashlib.sha256(body).hexdigest()
    file_id, key = result_file_id_for(job_id), f"{tenant_prefix(tenant_id)}results/{job_id}/{results_filename(job_id)}"
    if rewrite and not await results.rewritten(tenant_id, file_id, len(body), sha256):
        return None   # deleted by the tenant: not written again
    uri = await asyncio.to_thread(rt.store.put_bytes, key, body, "text/csv")  # same bytes on a retried handler
    return file_id, uri, len(body), sha256


async def make_results_file(rt: Rt, uow: UnitOfWork, tenant_id: str, job_id: str) -> str | None:
    """The job's results file, once; None when it exists already, the job was cancelled or reported no step."""
    results = ResultsStore(uow.conn)
    if await results.state(tenant_id, job_id) != "none":
        return None
    written = await write_results(rt, results, tenant_id, job_id)
    if written is None:
        await results.training_ended(tenant_id, job_id)
        return None
    file_id, uri, size, sha256 = written
    await results.claim(tenant_id, job_id, file_id)
    filename = results_filename(job_id)
    await FileStore(uow.conn).add(tenant_id, file_id, filename=filename, purpose=RESULTS_PURPOSE,
                                  dataset_purpose=RESULTS_PURPOSE, size=size, sha256=sha256, source_uri=uri,
                                  now=rt.clock())
    await uow.publish(FileCreatedV1(file_id=file_id, filename=filename, size_bytes=size, job_id=job_id, uri=uri),
                      tenant_id=tenant_id)
    rt.log.info("results file made", job_id=job_id, file_id=file_id)
    await wandb_runs.queue(rt, uow, tenant_id, job_id)
    return file_id


async def cancel(uow: UnitOfWork, tenant_id: str, job_id: str) -> None:
    """A cancelled job makes no results file."""
    await ResultsStore(uow.conn).cancelled(tenant_id, job_id)
    await wandb_runs.cancel(uow, tenant_id, job_id)
