"""A `dataset.submitted` event: queued for the validation worker (`entrypoints/worker.py`), or answered
at once with the verdict its immutable content already has."""

from __future__ import annotations

from whetstone.contracts import DatasetSubmittedV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters import validations
from ..context import IngestContext


async def submit(rt: Runtime[IngestContext], uow: UnitOfWork, tenant_id: str, submission_id: str, trace_id: str,
                 ev: DatasetSubmittedV1) -> None:
    """Queue the upload's validation (the worker runs it outside this transaction); a dataset id that
    already has a verdict gets the same verdict again (its content is immutable), and so does a new
    upload of bytes already accepted."""
    known = await validations.known_verdict(uow.conn, tenant_id, ev)
    if known is not None:
        verdict, recorded = known
        if not recorded:   # another upload's verdict: this id has it from now on
            await validations.remember_verdict(uow.conn, tenant_id, ev, verdict)
        await uow.publish(verdict, tenant_id=tenant_id)
    elif await validations.enqueue(uow.conn, submission_id, tenant_id, ev, trace_id):
        uow.after_commit(rt.ctx.wakeup.set)   # the worker must see the committed row
