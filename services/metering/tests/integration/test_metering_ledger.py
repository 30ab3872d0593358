"""Metering on the real embedded stack: exactly-once billing under duplicates and
cross-topic reordering, refunds as append-only corrections, reviews, anomalies,
tenant usage, metrics and audit."""

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest

from whetstone.contracts import (
    CheckpointRef, JobCompletedV1, JobFailedV1, JobPreemptedV1, JobQueuedV1, JobStartedV1, Resources, TrainingSpec,
)
from whetstone.contracts.enums import ChargeClass, UsageScope
from whetstone.metering.adapters.partitions import Ownership, key_hash
from whetstone.metering.adapters.store import LedgerStore
from whetstone.metering.bootstrap import build_service
from whetstone.metering.domain.billing import Charge
from whetstone.metering.domain.kinds import EntryKind, Outcome
from whetstone.metering.domain.ledger import Entry
from whetstone.runtime.identity import IdentityAuth
from whetstone.devstack.testing import outbox, send, send_event, wait_until

pytestmark = pytest.mark.integration
T = "demo"  # standard tier
T0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
CK = CheckpointRef(uri="s3://whetstone/tenants/demo/jobs/j/checkpoints/step-10", step=10, manifest_sha256="0" * 64)


def queued(job_id: str) -> JobQueuedV1:
    spec = TrainingSpec(base_model="m", base_model_sha256="ab" * 32, dataset_id="ds", dataset_version="cd" * 32,
                        train_uri="s3://whetstone/x", method="lora", hyperparameters={}, hyperparameters_hash="ef" * 32)
    return JobQueuedV1(job_id=job_id, tier="standard", spec=spec, resources=Resources(gpu_type="A100", gpus_per_node=2))


def started(job_id: str, seg: str, attempt: int, at: datetime, gpu: str = "A100", spot: bool = False,
            count: int = 2) -> JobStartedV1:
    return JobStartedV1(job_id=job_id, node_id="n1", segment_id=seg, attempt=attempt, gpu_type=gpu, gpu_count=count,
                        spot=spot, started_at=at)


def preempted(job_id: str, seg: str, at: datetime, checkpointed_at: datetime | None) -> JobPreemptedV1:
    return JobPreemptedV1(job_id=job_id, segment_id=seg, node_id="n1", reason="spot_loss", stopped_at=at,
                          checkpoint=CK if checkpointed_at else None, checkpointed_at=checkpointed_at)


def completed(job_id: str, seg: str, at: datetime) -> JobCompletedV1:
    return JobCompletedV1(job_id=job_id, segment_id=seg, node_id="n1", stopped_at=at, steps=100, final_checkpoint=CK)


def failed(job_id: str, seg: str | None, at: datetime | None, error_class: str) -> JobFailedV1:
    return JobFailedV1(job_id=job_id, segment_id=seg, node_id="n1" if seg else None, stopped_at=at,
                       error_class=error_class, code="x", message="boom")


def job_total_entry(job_id: str, outcome: str) -> Entry:
    charge = Charge(ChargeClass.CHARGED, Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0), "2026-11",
                    "standard", "2026-11", "test")
    return Entry(job_id, "rollup", UsageScope.JOB, "", EntryKind.CHARGE, 0, charge, None, 0, None, (), 0,
                 Outcome(outcome))


async def ledger(rt, job_id: str) -> list[dict]:
    return [dict(r) for r in await rt.pool.fetch("SELECT * FROM ledger WHERE job_id = $1 ORDER BY id", job_id)]


async def closed(rt, job_id: str) -> bool:
    return bool(await rt.pool.fetchval("SELECT 1 FROM ledger WHERE job_id = $1 AND scope = 'job'", job_id))


async def test_a_preempted_and_resumed_job_is_billed_once_per_segment_and_once_in_total(platform, settings):
    b = settings.kafka_bootstrap
    job = "ftjob-resumed"
    async with platform(build_service) as p:
        rt = p["metering"]
        # the stop of segment 2 arrives before its start, and everything is delivered three times
        await send_event(b, completed(job, "s2", T0 + timedelta(hours=3)), T, times=3)
        await send_event(b, queued(job), T, times=3)  # queued at ~now: an hour of queue time before T0 is not billed
        await send_event(b, started(job, "s1", 1, T0, spot=True), T, times=3)
        await send_event(b, preempted(job, "s1", T0 + timedelta(hours=1), T0 + timedelta(minutes=45)), T, times=3)
        await send_event(b, started(job, "s2", 2, T0 + timedelta(hours=2)), T, times=3)
        await wait_until(lambda: closed(rt, job), 30, "the job total")
        rows = await ledger(rt, job)
        assert sorted((r["scope"], r["segment_id"], r["entry"]) for r in rows) == [
            ("job", "", "charge"), ("segment", "s1", "charge"), ("segment", "s2", "charge")]
        assert rows[-1]["scope"] == "job"
        s1, s2, total = (next(r for r in rows if r["segment_id"] == s) for s in ("s1", "s2", ""))
        # preempted: 45 checkpointed minutes x 2 GPUs at the A100 spot price; the lost 15 minutes are free
        assert s1["billable_gpu_seconds"] == 45 * 60 * 2 and float(s1["cost"]) == pytest.approx(1.5 * 1.20)
        # completed on demand: 1 hour x 2 GPUs at 3.00/GPU-h (standard tier, price version 2026-11)
        assert s2["billable_gpu_seconds"] == 3600 * 2 and float(s2["cost"]) == pytest.approx(6.0)
        assert (s2["price_version"], s2["tier"], s2["charge_class"]) == ("2026-11", "standard", "charged")
        assert total["gpu_seconds"] == s1["gpu_seconds"] + s2["gpu_seconds"] == 3 * 3600 * 2 - 3600 * 2
        assert float(total["cost"]) == pytest.approx(7.8) and total["segments"] == 2
        published = await outbox(rt, "usage.metered")
        assert sorted((e["payload"]["scope"], e["payload"]["segment_id"]) for e in published) == [
            ("job", None), ("segment", "s1"), ("segment", "s2")]
        # every column of a ledger row as the entry had it (rows are appended as one JSON document)
        assert {(r["segment_id"], r["usage_event_id"]) for r in rows} == {
            (e["payload"]["segment_id"] or "", e["event_id"]) for e in published}
        assert (s1["spot"], s2["spot"], total["spot"], total["outcome"], s2["outcome"]) == (True, False, None,
                                                                                          "succeeded", None)
        assert s1["gpu_seconds"] == Decimal(3600 * 2) and s1["rate"] == Decimal("1.2") and s1["revision"] == 0
        assert len(s1["source_events"]) == 2 and set(s1["source_events"] + s2["source_events"]) <= set(
            total["source_events"]) and "5400 of 7200 GPU-s checkpointed" in s1["basis"]
        assert await rt.pool.fetchval("SELECT count(*) FROM inbox") == 5

        async with httpx.AsyncClient(base_url=p.url("metering")) as c:
            usage = (await c.get(f"/v1/usage/jobs/{job}", auth=IdentityAuth(T))).json()
            assert usage["total"]["cost"] == pytest.approx(7.8) and usage["total"]["charge_class"] == "charged"
            assert usage["total"]["billable_gpu_seconds"] == 45 * 60 * 2 + 7200 and len(usage["lines"]) == 2
            assert (await c.get(f"/v1/usage/jobs/{job}", auth=IdentityAuth("acme"))).status_code == 404
            # only a signed identity counts: a tenant header or a forged signature is refused
            assert (await c.get(f"/v1/usage/jobs/{job}", headers={"X-Tenant-Id": T})).status_code == 401
            forged = {"X-Whetstone-Identity": f"tenant={T};key=k;scopes=read;ts={int(time.time())}",
                      "X-Whetstone-Signature": "0" * 64}
            refused = await c.get(f"/v1/usage/jobs/{job}", headers=forged)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_identity"
            assert (await c.get("/v1/usage/anomalies", auth=IdentityAuth(T))).status_code == 403
            audit = (await c.get(f"/v1/usage/lines/{s1['id']}/events", auth=IdentityAuth(T))).json()
            assert [e["event_type"] for e in audit["events"]] == ["job.started", "job.preempted"]
            # the stored envelopes, as received (the audit trail is written as one JSON document per batch)
            assert [(e["payload"]["job_id"], e["payload"]["segment_id"]) for e in audit["events"]] == [(job, "s1")] * 2
            assert audit["events"][0]["occurred_at"] < audit["events"][1]["occurred_at"]
            audit = (await c.get(f"/v1/usage/lines/{total['id']}/events", auth=IdentityAuth(T))).json()
            assert sorted(e["event_type"] for e in audit["events"]) == [
                "job.completed", "job.preempted", "job.queued", "job.started", "job.started"]
            month = (await c.get(f"/v1/usage/tenants/{T}", params={"month": "2026-11"},
                                 auth=IdentityAuth(T))).json()
            assert (month["jobs"], month["succeeded"], month["success_rate"]) == (1, 1, 1.0)
            assert month["spend"] == pytest.approx(7.8) and month["gpu_hours"] == pytest.approx(4.0)
            assert month["by_gpu_type"][0]["gpu_type"] == "A100"
            await rt.ctx.usage_metrics.refresh(rt.pool, T0)
            text = (await c.get("/metrics")).text
            assert 'whetstone_metering_cost_usd{charge_class="charged",gpu_type="A100",tenant="demo"} 7.8' in text
            assert 'whetstone_metering_jobs{outcome="succeeded",tenant="demo"} 1.0' in text

        # one transaction closing jobs of several outcomes counts each outcome's own jobs
        totals = [job_total_entry(f"rollup-{i}", outcome) for i, outcome in
                  enumerate(["succeeded", "succeeded", "succeeded", "failed"])]
        async with rt.pool.acquire() as conn:
            await LedgerStore(conn).roll_up(totals)
            counts = dict(await conn.fetch("SELECT outcome, jobs FROM jobs_monthly WHERE tenant_id = 'rollup'"))
        assert counts == {"succeeded": 3, "failed": 1}


async def test_a_platform_failure_refunds_the_whole_job_with_reversals(platform, settings):
    b = settings.kafka_bootstrap
    job = "ftjob-platform"
    async with platform(build_service) as p:
        rt = p["metering"]
        await send_event(b, started(job, "s1", 1, T0, spot=True), T)
        await send_event(b, preempted(job, "s1", T0 + timedelta(hours=1), T0 + timedelta(minutes=30)), T)
        await wait_until(lambda: ledger(rt, job), 30, "the preempted segment's charge")
        await send_event(b, started(job, "s2", 2, T0 + timedelta(hours=2)), T)
        await send_event(b, failed(job, "s2", T0 + timedelta(hours=3), "platform"), T)
        await wait_until(lambda: closed(rt, job), 30, "the job total")
        rows = await ledger(rt, job)
        entries = [(r["segment_id"], r["entry"], r["revision"], r["charge_class"], float(r["cost"])) for r in rows]
        assert entries == [("s1", "charge", 0, "charged", pytest.approx(1.2)),
                           ("s1", "reversal", 0, "charged", pytest.approx(-1.2)),
                           ("s1", "charge", 1, "refunded", 0.0),
                           ("s2", "charge", 0, "refunded", 0.0),
                           ("", "charge", 0, "refunded", 0.0)]
        assert sum(float(r["cost"]) for r in rows if r["scope"] == "segment") == 0
        refunded = next(r for r in rows if r["segment_id"] == "s2")
        assert float(refunded["list_cost"]) == pytest.approx(6.0)  # what the platform's failure cost is refunded
        with pytest.raises(Exception, match="append-only"):
            await rt.pool.execute("UPDATE ledger SET cost = 0")
        published = [e["payload"]["segment_id"] for e in await outbox(rt, "usage.metered")]
        assert sorted(x for x in published if x) == ["s1", "s1#r0-reversal", "s1#r1", "s2"]


async def test_an_ambiguous_failure_is_held_for_review_until_an_operator_decides(platform, settings):
    b = settings.kafka_bootstrap
    job = "ftjob-ambiguous"
    async with platform(build_service) as p:
        rt = p["metering"]
        await send_event(b, started(job, "s1", 1, T0, gpu="H100", count=1), T)
        await send_event(b, failed(job, "s1", T0 + timedelta(hours=2), "ambiguous"), T)
        await wait_until(lambda: closed(rt, job), 30, "the job total")
        async with httpx.AsyncClient(base_url=p.url("metering")) as c:
            usage = (await c.get(f"/v1/usage/jobs/{job}", auth=IdentityAuth(T))).json()
            assert usage["total"]["charge_class"] == "review" and usage["total"]["cost"] == 0
            assert usage["total"]["list_cost"] == pytest.approx(10.0)
            held = (await c.get("/v1/usage/reviews", auth=IdentityAuth("platform", ("admin",), key_id="ops"))).json()["data"]
            assert held == [{"job_id": job, "tenant_id": T, "segments": 1, "held_usd": 10.0}]
            r = await c.post(f"/v1/usage/jobs/{job}/review", json={"decision": "charge", "note": "user OOM"},
                             auth=IdentityAuth("platform", ("admin",), key_id="ops"))
            assert r.status_code == 200, r.text
            again = await c.post(f"/v1/usage/jobs/{job}/review", json={"decision": "refund"},
                                 auth=IdentityAuth("platform", ("admin",), key_id="ops"))
            assert again.status_code == 409
            usage = (await c.get(f"/v1/usage/jobs/{job}", auth=IdentityAuth(T))).json()
            assert usage["total"]["charge_class"] == "charged" and usage["total"]["cost"] == pytest.approx(10.0)
            assert usage["total"]["corrected_after_close"] is True
            line = usage["lines"][0]
            audit = (await c.get(f"/v1/usage/lines/{line['id']}/events", auth=IdentityAuth(T))).json()
            assert [e["event_type"] for e in audit["events"]][-1] == "usage.reviewed"


async def test_bad_input_is_an_anomaly_never_a_charge_and_never_stops_the_consumer(platform, settings, monkeypatch):
    monkeypatch.setenv("WHETSTONE_METERING_ORPHAN_GRACE_S", "1")
    monkeypatch.setenv("WHETSTONE_METERING_SWEEP_INTERVAL_S", "0.3")
    b = settings.kafka_bootstrap
    async with platform(build_service) as p:
        rt = p["metering"]
        await send(b, "job.started", b"{not json", key="garbage")
        await send_event(b, started("j-backwards", "s1", 1, T0), T)
        await send_event(b, completed("j-backwards", "s1", T0 - timedelta(minutes=5)), T)
        await send_event(b, started("j-gpu", "s1", 1, T0, gpu="TPUv9"), T)
        await send_event(b, completed("j-gpu", "s1", T0 + timedelta(hours=1)), T)
        await send_event(b, started("j-long", "s1", 1, T0), T)
        await send_event(b, completed("j-long", "s1", T0 + timedelta(days=90)), T)
        await send_event(b, started("j-tenant", "s1", 1, T0), "nobody")
        await send_event(b, completed("j-tenant", "s1", T0 + timedelta(hours=1)), "nobody")
        await send_event(b, started("j-old", "s1", 1, datetime(2019, 1, 1, tzinfo=UTC)), T)
        await send_event(b, completed("j-old", "s1", datetime(2019, 1, 1, 1, tzinfo=UTC)), T)
        await send_event(b, completed("j-unknown", "s9", T0), T)
        await send_event(b, started("j-good", "s1", 1, T0, gpu="L4", count=1), T)
        await send_event(b, completed("j-good", "s1", T0 + timedelta(hours=1)), T)

        async def anomalies():
            rows = await rt.pool.fetch("SELECT job_id, code FROM anomalies WHERE resolved_at IS NULL")
            return dict(rows) if len(rows) >= 6 else None
        found = await wait_until(anomalies, 30, "six anomalies")
        assert found == {"j-backwards": "stop_before_start", "j-gpu": "unknown_gpu_type", "j-long": "absurd_duration",
                         "j-tenant": "unknown_tenant", "j-old": "no_price_version", "j-unknown": "unknown_job"}
        await wait_until(lambda: closed(rt, "j-good"), 30, "the good job after the bad ones")
        billed = await rt.pool.fetch("SELECT DISTINCT job_id FROM ledger WHERE cost <> 0")
        assert [r["job_id"] for r in billed] == ["j-good"]
        # a start arriving late explains the unknown job: the anomaly is resolved and the segment billed
        await send_event(b, started("j-unknown", "s9", 1, T0 - timedelta(hours=1), gpu="L4", count=1), T)
        await wait_until(lambda: rt.pool.fetchval("SELECT resolved_at IS NOT NULL FROM anomalies"
                                                  " WHERE job_id = 'j-unknown'"), 30, "the explained anomaly")
        cost = await rt.pool.fetchval("SELECT sum(cost) FROM ledger WHERE job_id = 'j-unknown' AND scope = 'segment'")
        assert float(cost) == pytest.approx(0.8)
        async with httpx.AsyncClient(base_url=p.url("metering")) as c:
            listed = (await c.get("/v1/usage/anomalies", auth=IdentityAuth("platform", ("admin",), key_id="ops"))).json()["data"]
            assert {a["code"] for a in listed} == set(found.values()) - {"unknown_job"}


async def test_a_node_lost_segment_is_a_refund_with_its_basis_and_a_forged_tenant_changes_nothing(platform, settings):
    """Issue 20: a platform fault shows in the ledger and the tenant's month as a refund, with what was
    checkpointed and what was lost; an event naming another tenant for the job is dead-lettered."""
    b = settings.kafka_bootstrap
    job = "ftjob-lost"
    async with platform(build_service) as p:
        rt = p["metering"]
        await send_event(b, queued(job), T)
        await send_event(b, started(job, "s1", 1, T0), T)
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM segments WHERE job_id = $1", job),
                         30, "segment 1 known")
        # another tenant tries to complete the job (it would bill the segment and close the job)
        await send_event(b, completed(job, "s1", T0 + timedelta(minutes=5)), "acme")
        lost = JobPreemptedV1(job_id=job, segment_id="s1", node_id="n1", reason="node_lost",
                              stopped_at=T0 + timedelta(seconds=256), checkpoint=CK,
                              checkpointed_at=T0 + timedelta(seconds=250))
        await send_event(b, lost, T)
        await wait_until(lambda: rt.pool.fetchval(
            "SELECT count(*) = 1 FROM ledger WHERE job_id = $1 AND scope = 'segment'", job), 30, "s1 billed")
        (s1,) = [r for r in await ledger(rt, job) if r["segment_id"] == "s1"]
        assert s1["charge_class"] == "refunded" and float(s1["cost"]) == 0 and float(s1["list_cost"]) > 0
        assert "500 of 512 GPU-s checkpointed, 12 GPU-s lost" in s1["basis"], s1["basis"]
        letters = await wait_until(lambda: outbox_dlq(rt), 30, "the forged event dead-lettered")
        assert "tenant_mismatch" in letters[0]["payload"]["error"]
        assert rt.metrics.registry.get_sample_value(
            "whetstone_refused_total", {"service": "metering", "reason": "tenant_mismatch"}) == 1
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rt.http.port}") as c:
            month = (await c.get(f"/v1/usage/tenants/{T}", params={"month": "2026-11"},
                                 auth=IdentityAuth(T))).json()
        assert month["refunded"] == pytest.approx(float(s1["list_cost"])) and month["spend"] == 0


async def outbox_dlq(rt) -> list[dict]:
    return await outbox(rt, "job.completed.dlq")


async def test_a_replica_sweeps_only_the_jobs_of_the_partitions_it_holds(platform):
    """Replicas split the partitions: each settles by time only the jobs keyed to the partition numbers
    it holds (their events all reach it); a job from before the key hash counts as partition 0."""
    now = datetime.now(UTC)
    ended = [f"ftjob-sweep-ended-{i}" for i in range(12)]
    orphaned = [f"ftjob-sweep-orphan-{i}" for i in range(12)]
    async with platform(build_service) as p:
        rt = p["metering"]
        async with rt.pool.acquire() as conn:
            tx = conn.transaction()  # never committed: the running service's own sweep never sees these rows
            await tx.start()
            try:
                store = LedgerStore(conn)
                await store.lock_jobs(ended + orphaned + ["ftjob-sweep-old"], [T] * 25, now)
                await conn.execute("UPDATE jobs SET terminal_at = $2 WHERE job_id = ANY($1)",
                                   [*ended, "ftjob-sweep-old"], now - timedelta(hours=1))
                await conn.execute("UPDATE jobs SET key_hash = NULL WHERE job_id = 'ftjob-sweep-old'")
                await conn.execute("INSERT INTO segments (job_id, segment_id, tenant_id, first_seen_at, stop_at)"
                                   " SELECT j, 's1', $2, $3, $3 FROM unnest($1::text[]) AS j", orphaned, T,
                                   now - timedelta(hours=1))
                due = {}
                for held in ({0}, {1, 2}):
                    due[frozenset(held)] = set(await store.jobs_due(now, now, Ownership(3, frozenset(held)), 100))
            finally:
                await tx.rollback()
    mine = {j for j in ended + orphaned if key_hash(j) % 3 == 0}
    assert 0 < len(mine) < 24
    assert due[frozenset({0})] == mine | {"ftjob-sweep-old"}
    assert due[frozenset({1, 2})] == set(ended + orphaned) - mine
