"""Quota usage across services: metering's usage.metered events, and nothing else, drive the
scheduler's tenant_usage, which must equal metering's ledger after segments, job totals,
corrections made after a job closed (an operator's review), re-sent events and a wrong tenant."""

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from whetstone.contracts import CheckpointRef, JobFailedV1, JobPreemptedV1, JobStartedV1, UsageMeteredV1
from whetstone.metering.bootstrap import build_service as metering
from whetstone.runtime.identity import IdentityAuth
from whetstone.devstack.testing import consume_all, send_event, wait_until
from whetstone.scheduler.bootstrap import build_service as scheduler

pytestmark = pytest.mark.integration
T = "demo"
T0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
CK = CheckpointRef(uri="s3://whetstone/tenants/demo/jobs/j/checkpoints/step-10", step=10, manifest_sha256="0" * 64)


def started(job_id: str, seg: str, attempt: int, at: datetime, spot: bool) -> JobStartedV1:
    return JobStartedV1(job_id=job_id, node_id="n1", segment_id=seg, attempt=attempt, gpu_type="H100", gpu_count=1,
                        spot=spot, started_at=at)


async def ledger_sums(rt) -> tuple[float, float] | None:
    """Billable GPU-seconds and cost over the segment lines (corrections included); None before any."""
    row = await rt.pool.fetchrow("SELECT count(*) AS n, sum(billable_gpu_seconds) AS s, sum(cost) AS c"
                                 " FROM ledger WHERE scope = 'segment'")
    return (float(row["s"]), float(row["c"])) if row["n"] else None


async def quota_usage(rt) -> tuple[int, float, float] | None:
    row = await rt.pool.fetchrow("SELECT jobs, gpu_seconds, cost FROM tenant_usage WHERE tenant_id = $1", T)
    return (row["jobs"], row["gpu_seconds"], float(row["cost"])) if row else None


async def test_quota_usage_follows_the_ledger_through_segments_totals_and_later_corrections(platform, settings):
    b = settings.kafka_bootstrap
    job = "ftjob-quota"
    async with platform(metering, scheduler) as p, httpx.AsyncClient(base_url=p.url("metering")) as c:
        meter, sched = p["metering"], p["scheduler"]

        # a preempted segment counts while the job is still running, not only when it ends
        await send_event(b, started(job, "s1", 1, T0, spot=True), T)
        await send_event(b, JobPreemptedV1(job_id=job, segment_id="s1", node_id="n1", reason="spot_loss",
                                           stopped_at=T0 + timedelta(hours=1), checkpoint=CK,
                                           checkpointed_at=T0 + timedelta(minutes=30)), T)
        seg1 = await wait_until(lambda: ledger_sums(meter), 30, "segment 1 billed")
        assert seg1[0] == 30 * 60
        await wait_until(lambda: _equals(quota_usage(sched), (0, *seg1)), 30, "segment 1 in the quota")

        # an ambiguous failure holds segment 2 for review; the job total closes the job: one job, same seconds
        await send_event(b, started(job, "s2", 2, T0 + timedelta(hours=2), spot=False), T)
        await send_event(b, JobFailedV1(job_id=job, segment_id="s2", node_id="n1",
                                        stopped_at=T0 + timedelta(hours=4), error_class="ambiguous", code="x",
                                        message="boom"), T)
        await wait_until(lambda: meter.pool.fetchval("SELECT 1 FROM ledger WHERE scope = 'job'"), 30, "job total")
        held = await ledger_sums(meter)
        await wait_until(lambda: _equals(quota_usage(sched), (1, *held)), 30, "job total in the quota")

        # the operator charges it after the job closed: reversals and new charges reach the quota too
        r = await c.post(f"/v1/usage/jobs/{job}/review", json={"decision": "charge", "note": "user OOM"},
                         auth=IdentityAuth("platform", ("admin",), key_id="ops"))
        assert r.status_code == 200, r.text
        charged = await ledger_sums(meter)
        assert charged[1] > held[1] and charged[0] == 30 * 60 + 2 * 3600
        await wait_until(lambda: _equals(quota_usage(sched), (1, *charged)), 30, "the review's correction")

        # the same usage re-sent under new event ids (a producer that re-published) changes nothing
        published = await consume_all(b, "usage.metered", timeout=1.0)
        # s1, then s1 and s2 held for review, the job total, and the review's reversals and new charges
        assert len(published) == 9
        for e in published:
            env = json.loads(e)
            await send_event(b, UsageMeteredV1(**env["payload"]), T)
        # a tenant claiming another tenant's job is dead-lettered, not counted
        await send_event(b, UsageMeteredV1(job_id=job, scope="segment", segment_id="s9", gpu_seconds=9e6,
                                           billable_gpu_seconds=9e6, charge_class="charged", price_version="v",
                                           cost=9e3), "acme")
        letters = await wait_until(lambda: _letters(b), 30, "the wrong tenant's usage dead-lettered")
        assert "names tenant 'acme'" in json.loads(letters[0])["payload"]["error"]
        # every copy handled (and the dead letter's claim), so nothing is still on its way to the quota
        await wait_until(lambda: sched.pool.fetchval("SELECT count(*) = $1 FROM inbox WHERE topic = 'usage.metered'",
                                                     2 * len(published) + 1), 30, "re-sent usage handled")
        assert await quota_usage(sched) == (1, pytest.approx(charged[0]), pytest.approx(charged[1]))
        assert await sched.pool.fetchval("SELECT count(*) FROM tenant_usage WHERE tenant_id = 'acme'") == 0


async def _equals(got, want) -> bool:
    value = await got
    return value is not None and value[0] == want[0] and value[1:] == pytest.approx(want[1:])


async def _letters(bootstrap):
    return await consume_all(bootstrap, "usage.metered.dlq", timeout=1.0) or None
