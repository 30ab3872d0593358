"""The W&B worker: claim a queued W&B offline run (`adapters/wandb_runs.py`), write it with the SDK in a
process of its own with no transaction open and no Kafka partition held, record its result file in one
short transaction (`usecases/wandb_runs.py`). The lease is renewed while the SDK runs; a run whose writing
failed `wandb_max_attempts` times is given up (no W&B file; the results CSV stands) with its error kept."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid

from whetstone.runtime.service import Runtime

from ..adapters.wandb_runs import WANDB_RUNS, WandbRunClaim, WandbRunStore
from ..context import IngestContext
from ..usecases.wandb_runs import write_claimed


async def wandb_worker(rt: Runtime[IngestContext]) -> None:
    owner = f"{socket.gethostname()}:{os.getpid()}:wandb:{uuid.uuid4().hex[:8]}"
    cfg = rt.ctx.config
    wakeup = rt.ctx.wandb_wakeup
    while True:
        wakeup.clear()   # before the claim: a run queued while it looks sets it again, and is not waited for
        claim = await WandbRunStore(rt.pool).claim_next(rt.pool, owner, cfg.wandb_lease_s)
        if claim is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), timeout=cfg.wandb_poll_s)
            continue
        await write_run(rt, claim)


async def write_run(rt: Runtime[IngestContext], claim: WandbRunClaim) -> None:
    cfg = rt.ctx.config
    log = rt.log.bind(job_id=claim.job_id, tenant_id=claim.tenant_id, attempt=claim.attempts)
    renewing = asyncio.create_task(WANDB_RUNS.keep_renewed(rt.pool, claim.run_key, claim.owner, cfg.wandb_lease_s,
                                                           on_lost=lambda: log.warning("W&B run lease lost")))
    try:
        await write_claimed(rt, claim)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        store = WandbRunStore(rt.pool)
        with contextlib.suppress(Exception):    # if even this fails, the lease runs out and the run is retried
            if claim.attempts >= cfg.wandb_max_attempts:
                log.error("W&B offline run given up", error=error)
                await store.give_up(claim, error)
            else:
                log.warning("W&B offline run failed; retrying", error=error)
                await store.release(claim, error, cfg.wandb_backoff_s)
    finally:
        renewing.cancel()
