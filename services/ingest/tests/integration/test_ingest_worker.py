"""Validation runs outside the consumer: `dataset.submitted` only queues it, a worker claims it under a
lease, runs the gate with no transaction open, and records the verdict briefly. A worker that died is
taken over when its lease runs out; an upload that keeps killing the worker is answered, not retried."""

from __future__ import annotations

import asyncio
import threading

import pytest

from whetstone.contracts import DatasetValidatedV1
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.ingest.adapters import validations
from whetstone.ingest.bootstrap import build_service
from whetstone.ingest.config import IngestSettings

from .test_ingest_service import jsonl, upload, verdicts

pytestmark = pytest.mark.integration
FAST = IngestSettings(validation_poll_s=0.2, validation_lease_s=3.0)


class Slow:
    """A toxicity classifier that holds the gate for `hold_s` on its first call."""
    name = "slow"

    def __init__(self, hold_s: float) -> None:
        self.started, self.hold_s = threading.Event(), hold_s

    def scores(self, texts):
        if not self.started.is_set():
            self.started.set()
            threading.Event().wait(self.hold_s)
        return [0.0] * len(texts)


async def test_the_gate_runs_with_no_transaction_open_after_the_submission_is_committed(platform, settings, kit):
    async with platform(lambda: build_service(FAST)) as p:
        rt = p["ingest"]
        rt.ctx.toxicity = slow = Slow(hold_s=3.0)
        sub = upload(rt, "demo", jsonl(kit.good_rows(20)))
        env = await send_event(settings.kafka_bootstrap, sub, "demo")
        await wait_until(lambda: asyncio.to_thread(slow.started.wait, 0.1), 30, "the gate started")
        # the submission is already consumed and committed (inbox), its validation claimed, and no
        # transaction of any connection has been open for more than half a second while the gate runs
        assert await rt.pool.fetchval("SELECT count(*) FROM inbox WHERE message_id = $1", str(env.event_id)) == 1
        assert await rt.pool.fetchval("SELECT status FROM validations WHERE dataset_id = $1",
                                      sub.dataset_id) == "running"
        (queued,) = validations.PROBES              # the queue KEDA scales ingest on
        assert dict(await rt.pool.fetch(queued.sql)) == {"running": 1}
        for _ in range(8):
            long_open = await rt.pool.fetch(
                "SELECT query FROM pg_stat_activity WHERE xact_start < now() - interval '500 milliseconds'"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
            assert not long_open, long_open
            await asyncio.sleep(0.25)
        [verdict] = await verdicts(rt, sub.dataset_id)
        assert verdict["payload"]["status"] == "accepted" and verdict["trace_id"] == env.trace_id
        row = await rt.pool.fetchrow("SELECT status, attempts FROM validations WHERE dataset_id = $1", sub.dataset_id)
        assert dict(row) == {"status": "done", "attempts": 1}


async def test_a_dead_workers_claim_is_taken_over_and_an_upload_that_keeps_killing_it_is_answered(
        platform, settings, kit):
    async with platform(lambda: build_service(FAST)) as p:
        rt = p["ingest"]
        orphan = upload(rt, "demo", jsonl(kit.good_rows(12)))
        killer = upload(rt, "demo", jsonl(kit.good_rows(13)))
        for sub, attempts, error in ((orphan, 1, None), (killer, settings.max_attempts, "MemoryError: (OOM-killed)")):
            # as a worker leaves them when it dies mid-validation: running, its lease about to run out
            await rt.pool.execute(
                "INSERT INTO validations (submission_id, tenant_id, dataset_id, submitted, trace_id, status,"
                " lease_owner, lease_until, attempts, last_error)"
                " VALUES ($1, 'demo', $2, $3, 't', 'running', 'dead-worker', now() + interval '1 second', $4, $5)",
                f"sub-{sub.dataset_id}", sub.dataset_id, sub.model_dump(mode="json"), attempts, error)
        await asyncio.sleep(0.5)
        assert await outbox(rt, "dataset.validated") == []        # a live lease is not taken over
        [taken] = await verdicts(rt, orphan.dataset_id)
        assert DatasetValidatedV1.model_validate(taken["payload"]).status == "accepted"
        [answered] = await verdicts(rt, killer.dataset_id)
        error = answered["payload"]["errors"][0]
        assert answered["payload"]["status"] == "rejected" and error["code"] == "validation_crashed"
        assert "MemoryError" in error["message"] and f"failed {settings.max_attempts} times" in error["message"]
        rows = await rt.pool.fetch("SELECT dataset_id, status, attempts FROM validations ORDER BY attempts")
        assert [(r["status"], r["attempts"]) for r in rows] == [("done", 2), ("done", settings.max_attempts + 1)]
        # nothing is validated twice: no finished validation can be claimed again
        assert await validations.claim_next(rt.pool, "probe", 1.0) is None
        assert len(await outbox(rt, "dataset.validated")) == 2
        # retention: finished validations go once the inbox no longer remembers their submissions
        await rt.pool.execute("UPDATE validations SET updated_at = now() - interval '15 days'"
                              " WHERE dataset_id = $1", orphan.dataset_id)
        assert await validations.forget_done(rt.pool, settings.inbox_retention_days) == 1
        assert await rt.pool.fetchval("SELECT count(*) FROM validations") == 1
