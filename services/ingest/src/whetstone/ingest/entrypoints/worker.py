"""The validation worker: claim a queued upload (`adapters/validations.py`), run the gate in a thread
with no transaction open and no Kafka partition held, then record the verdict and publish
`dataset.validated` in one short transaction.

The claim's lease is renewed while the gate runs. A worker that dies stops renewing; when the
lease runs out, this process after a restart (or another replica) claims the upload again. A
worker that lost its lease records and publishes nothing. An upload whose validation crashed
`max_attempts` times is answered with a rejection naming the last error, not retried forever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid

from whetstone.runtime.delivery import unavailable_dependency
from whetstone.runtime.leases import wait_for_work
from whetstone.runtime.service import Runtime

from ..adapters import validations
from ..adapters.validations import Validation
from ..context import IngestContext
from ..usecases.validation import reject, validate


async def validation_worker(rt: Runtime[IngestContext]) -> None:
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    cfg = rt.ctx.config
    swept = 0.0
    while True:
        claim = await validations.claim_next(rt.pool, owner, cfg.validation_lease_s)
        if claim is None:
            if time.monotonic() - swept > rt.settings.retention_interval_s:
                swept = time.monotonic()
                await validations.forget_done(rt.pool, rt.settings.inbox_retention_days)
            await wait_for_work(rt.ctx.wakeup, cfg.validation_poll_s)
            continue
        await validate_claim(rt, claim)


async def validate_claim(rt: Runtime[IngestContext], v: Validation) -> None:
    ev, settings = v.submitted, rt.settings
    log = rt.log.bind(dataset_id=ev.dataset_id, tenant_id=v.tenant_id, attempt=v.attempts)
    renewing = asyncio.create_task(validations.VALIDATIONS.keep_renewed(
        rt.pool, v.submission_id, v.owner, rt.ctx.config.validation_lease_s,
        on_lost=lambda: log.warning("validation lease lost")))
    try:
        async with rt.pool.acquire() as conn:
            known = await validations.known_verdict(conn, v.tenant_id, ev)
        event, recorded = known if known is not None else (None, False)
        if event is None and v.attempts > settings.max_attempts:
            cause = v.last_error or "the ingest process died"
            event = reject(ev, "", "validation_crashed", f"validating this upload failed {v.attempts - 1} times "
                           f"({cause}); it is not retried: check the file, or ask the operator")
        elif event is None:
            event = await validate(rt, v.tenant_id, ev)
        async with rt.uow() as uow:
            if not await validations.finish(uow.conn, v):
                log.warning("validation abandoned: another worker holds it now")
                return
            if not recorded:
                await validations.remember_verdict(uow.conn, v.tenant_id, ev, event)
            await uow.publish(event, tenant_id=v.tenant_id, trace_id=v.trace_id)
        log.info("dataset validated", status=event.status, rows=event.rows_kept, errors=event.error_count)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        transient = unavailable_dependency(exc) is not None
        if transient:
            log.warning("validation hit an unreachable dependency; retrying", error=error)
        else:
            log.exception("validation crashed", attempts_left=max(settings.max_attempts - v.attempts, 0))
        with contextlib.suppress(Exception):    # if even this fails, the lease runs out and the upload is retried
            await validations.release(rt.pool, v, error, transient=transient,
                                      backoff_s=rt.ctx.config.validation_backoff_s,
                                      backoff_max_s=rt.ctx.config.validation_backoff_max_s,
                                      transient_budget_s=settings.transient_retry_s)
    finally:
        renewing.cancel()
