"""The eval worker: claim the next evaluation and evaluate it (`usecases/evaluate.py`).

Claims carry a lease renewed by a heartbeat. A worker that dies stops renewing; when the lease
runs out another worker (this process after a restart, or another replica: they form a group
through the table, `FOR UPDATE SKIP LOCKED`) claims it and resumes after the last recorded stage."""

from __future__ import annotations

import os
import socket
import uuid

from whetstone.runtime.leases import wait_for_work
from whetstone.runtime.service import Runtime

from ..adapters.repository import EvalStore
from ..context import EvalContext
from ..usecases.evaluate import evaluate_claim


async def eval_worker(rt: Runtime[EvalContext]) -> None:
    cfg = rt.ctx.config
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    while True:
        async with rt.pool.acquire() as conn:
            claim = await EvalStore(conn).claim_next(owner, cfg.lease_s)
        if claim is None:
            await wait_for_work(rt.ctx.wakeup, cfg.poll_s)
            continue
        await evaluate_claim(rt, claim)
