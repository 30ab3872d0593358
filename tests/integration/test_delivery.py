"""At-least-once delivery: each design-card event delivered three times has one effect;
poison messages land in the DLQ and the partition moves on."""

import asyncio
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, DatasetValidatedV1, EvalCompletedV1, JobPreemptedV1, JobQueuedV1,
    JobStartedV1, Metric, ModelPromotedV1, NodeHeartbeatV1, Resources, TrainingSpec, UsageMeteredV1,
)
from whetstone.metering.bootstrap import build_service as metering
from whetstone.registry.bootstrap import build_service as registry
from whetstone.runtime.checkpoints import upload_checkpoint
from whetstone.runtime.service import Service
from whetstone.runtime.identity import IdentityAuth
from whetstone.devstack.testing import consume_all, outbox, send, send_event, wait_until
from whetstone.scheduler.bootstrap import build_service as scheduler

pytestmark = pytest.mark.integration
T = "demo"
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def spec(job_id="j1") -> TrainingSpec:
    return TrainingSpec(base_model="pinned-model", base_model_sha256="ab" * 32, dataset_id="ds-1",
                        dataset_version="cd" * 32, train_uri="s3://whetstone/tenants/demo/datasets/ds-1/train.jsonl",
                        method="lora", hyperparameters={"n_epochs": 1}, hyperparameters_hash="ef" * 32)


async def inbox_count(rt, topic: str) -> int:
    return await rt.pool.fetchval("SELECT count(*) FROM inbox WHERE topic = $1", topic)


async def settle(rt, topic: str, delivered: int = 3) -> None:
    """Wait until the service has seen every copy (handled + duplicates)."""
    async def seen():
        m = rt.metrics.registry.get_sample_value
        total = sum(m("whetstone_messages_consumed_total", {"service": rt.name, "topic": topic, "outcome": o}) or 0
                    for o in ("handled", "duplicate", "dead_lettered"))
        return total >= delivered
    await wait_until(seen, 30, f"{delivered} deliveries of {topic}")


async def create_job(p, model: str, key: str = "k1", training_file: str = "ds-1") -> dict:
    async with httpx.AsyncClient(base_url=p.url("scheduler")) as c:
        r = await c.post("/v1/fine_tuning/jobs", json={"model": model, "training_file": training_file},
                         auth=IdentityAuth(T), headers={"Idempotency-Key": key})
        assert r.status_code == 200, r.text
        return r.json()


def validated(dataset_id="ds-1") -> DatasetValidatedV1:
    return DatasetValidatedV1(dataset_id=dataset_id, version="cd" * 32, name="d.jsonl", status="accepted",
                              rows_total=20, rows_kept=20,
                              train_uri=f"s3://whetstone/tenants/demo/datasets/{dataset_id}/train.jsonl")


async def test_dataset_validated_thrice_queues_the_job_once(platform, settings, fake_model):
    async with platform(scheduler) as p:
        job = await create_job(p, fake_model)
        assert job["status"] == "validating_files"
        await send_event(settings.kafka_bootstrap, validated(), T, times=3)
        await settle(p["scheduler"], "dataset.validated")
        assert await inbox_count(p["scheduler"], "dataset.validated") == 1
        queued = await outbox(p["scheduler"], "job.queued")
        assert len(queued) == 1 and queued[0]["payload"]["job_id"] == job["id"]
        assert await p["scheduler"].pool.fetchval("SELECT count(*) FROM datasets") == 1


async def _running_job(p, settings, model) -> dict:
    job = await create_job(p, model)
    await send_event(settings.kafka_bootstrap, NodeHeartbeatV1(node_id="n1", gpu_type="cpu", gpu_count=1,
                                                               free_gpu_ids=[0], sent_at=datetime.now(UTC)), "platform")
    await send_event(settings.kafka_bootstrap, validated(), T)
    rt = p["scheduler"]
    assigned = await wait_until(lambda: outbox(rt, "job.assigned"), 30, "job.assigned")
    seg = assigned[0]["payload"]["segment_id"]
    await send_event(settings.kafka_bootstrap, JobStartedV1(job_id=job["id"], node_id="n1", segment_id=seg, attempt=1,
                                                            gpu_type="cpu", gpu_count=1, started_at=NOW), T)
    await wait_until(lambda: rt.pool.fetchval("SELECT status = 'running' FROM jobs"), 30, "running")
    return {"id": job["id"], "segment_id": seg}


async def test_job_preempted_thrice_requeues_once(platform, settings, fake_model):
    async with platform(scheduler) as p:
        job = await _running_job(p, settings, fake_model)
        ck = CheckpointRef(uri="s3://whetstone/tenants/demo/jobs/x/checkpoints/step-10", step=10, manifest_sha256="0" * 64)
        await send_event(settings.kafka_bootstrap, JobPreemptedV1(
            job_id=job["id"], segment_id=job["segment_id"], node_id="n1", reason="spot_loss",
            stopped_at=NOW + timedelta(minutes=5), checkpoint=ck), T, times=3)
        rt = p["scheduler"]
        await settle(rt, "job.preempted")
        requeued = [e for e in await outbox(rt, "job.queued") if e["payload"]["requeued"]]
        assert len(requeued) == 1
        async def resume_placed() -> list[dict] | None:
            found = await outbox(rt, "job.assigned")
            return found if len(found) >= 2 else None

        assigned = await wait_until(resume_placed, 30, "the resume placement")
        assert len(assigned) == 2  # first placement + exactly one resume placement
        second = assigned[1]["payload"]
        assert second["attempt"] == 2 and second["resume_from"]["step"] == 10


async def test_registry_registers_once_under_triple_delivery(platform, settings, tmp_path):
    """job.queued, checkpoint.written (final) and eval.completed, each delivered three times."""
    async with platform(registry) as p:
        b = settings.kafka_bootstrap
        await send_event(b, JobQueuedV1(job_id="j1", tier="standard", spec=spec(),
                                        resources=Resources(gpu_type="cpu", gpus_per_node=1)), T, times=3)
        artifact = tmp_path / "final"  # the registry reads the manifest (per-file sha256) of the final checkpoint
        artifact.mkdir()
        (artifact / "adapter_model.safetensors").write_bytes(b"weights")
        (artifact / "adapter_config.json").write_text('{"peft_type": "LORA", "base_model_name_or_path": null}')
        up = upload_checkpoint(p["registry"].store, artifact, "tenants/demo/jobs/j1/checkpoints/final", {"job_id": "j1"})
        await send_event(b, CheckpointWrittenV1(job_id="j1", segment_id="j1-s1", checkpoint_id="c", kind="final",
                                                step=40, uri=up.uri, manifest_sha256=up.manifest_sha256, files=2,
                                                size_bytes=10, written_at=NOW), T, times=3)
        await send_event(b, EvalCompletedV1(job_id="j1", checkpoint_uri=up.uri, verdict="passed", reasons=["ok"],
                                            metrics=[Metric(name="holdout_loss", base=2.0, candidate=1.0)]), T, times=3)
        rt = p["registry"]
        for topic in ("job.queued", "checkpoint.written", "eval.completed"):
            await settle(rt, topic)
            assert await inbox_count(rt, topic) == 1
        assert await rt.pool.fetchval("SELECT count(*) FROM models") == 1
        assert await rt.pool.fetchval("SELECT stage FROM models") == "staging"
        assert len(await outbox(rt, "model.registered")) == 1
        promoted = await outbox(rt, "model.promoted")
        assert [e["payload"]["to_stage"] for e in promoted] == ["staging"]
        assert await rt.pool.fetchval("SELECT count(*) FROM stage_history") == 2  # dev, staging: once each


async def test_usage_metered_thrice_counts_once_in_quota(platform, settings):
    async with platform(scheduler) as p:
        await send_event(settings.kafka_bootstrap, UsageMeteredV1(
            job_id="j1", scope="job", gpu_seconds=3600, billable_gpu_seconds=3600, charge_class="charged",
            price_version="2026-11", cost=3.0), T, times=3)
        rt = p["scheduler"]
        await settle(rt, "usage.metered")
        row = await rt.pool.fetchrow("SELECT jobs, gpu_seconds, cost FROM tenant_usage WHERE tenant_id = $1", T)
        assert (row["jobs"], row["gpu_seconds"], float(row["cost"])) == (1, 3600, 3.0)


async def test_metering_bills_a_triple_delivered_preemption_once(platform, settings):
    async with platform(metering) as p:
        b = settings.kafka_bootstrap
        await send_event(b, JobStartedV1(job_id="j1", node_id="n1", segment_id="j1-s1", attempt=1, gpu_type="A100",
                                         gpu_count=2, spot=True, started_at=NOW), T, times=3)
        ck = CheckpointRef(uri="s3://x", step=10, manifest_sha256="0" * 64)
        await send_event(b, JobPreemptedV1(job_id="j1", segment_id="j1-s1", node_id="n1", reason="spot_loss",
                                           stopped_at=NOW + timedelta(hours=1), checkpoint=ck,
                                           checkpointed_at=NOW + timedelta(minutes=45)), T, times=3)
        rt = p["metering"]
        await settle(rt, "job.preempted")
        rows = await rt.pool.fetch("SELECT * FROM ledger")
        assert len(rows) == 1
        # 45 checkpointed minutes x 2 GPUs at the A100 spot price (1.20/h); the lost 15 minutes are not billed
        assert rows[0]["billable_gpu_seconds"] == 45 * 60 * 2
        assert float(rows[0]["cost"]) == pytest.approx(1.5 * 1.20)
        assert len(await outbox(rt, "usage.metered")) == 1


async def test_poison_messages_go_to_the_dlq_and_the_partition_continues(platform, settings):
    attempts = {"bad": 0}

    async def handler(rt, uow, env, ev):
        if ev.reason == "explode":
            attempts["bad"] += 1
            raise RuntimeError("handler bug")
        await uow.conn.execute("INSERT INTO seen VALUES ($1)", ev.model_id)

    def probe() -> Service:
        return Service(name="probe", migrations=["CREATE TABLE seen (model_id text)"],
                       subscriptions={"model.promoted": handler})

    b = settings.kafka_bootstrap
    async with platform(probe) as p:
        await send(b, "model.promoted", b"{not json", key="m1")
        await send(b, "model.promoted", json.dumps({"event_type": "model.promoted", "payload": {}}).encode(), key="m1")
        await send_event(b, ModelPromotedV1(model_id="m1", from_stage="dev", to_stage="staging", reason="explode"), T)
        await send_event(b, ModelPromotedV1(model_id="m1", from_stage="dev", to_stage="staging", reason="fine"), T)
        rt = p["probe"]
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM seen"), 30, "good message after poison")
        letters = [json.loads(v) for v in await wait_until(
            lambda: _dlq(b), 30, "three dead letters")]
        errors = sorted(letter["payload"]["error"] for letter in letters)
        assert any(e.startswith("malformed message") and "JSON" in e for e in errors)
        assert any("handler bug" in e for e in errors)
        assert sum(e.startswith("malformed") for e in errors) == 2
        assert attempts["bad"] == settings.max_attempts
        bad = next(x for x in letters if "handler bug" in x["payload"]["error"])
        assert bad["payload"]["attempts"] == settings.max_attempts and bad["payload"]["source_topic"] == "model.promoted"


async def _dlq(bootstrap):
    values = await consume_all(bootstrap, "model.promoted.dlq", timeout=1.0)
    return values if len(values) >= 3 else None


async def test_redelivery_after_crash_between_commit_and_ack_has_one_effect(platform, settings):
    """The service commits its transaction, then dies before committing the Kafka offset: the
    restarted service gets the message again and its inbox absorbs it."""
    b = settings.kafka_bootstrap
    ev = UsageMeteredV1(job_id="j9", scope="job", gpu_seconds=60, billable_gpu_seconds=60, charge_class="charged",
                        price_version="2026-11", cost=1.0)
    async with platform(scheduler) as p:
        env = await send_event(b, ev, T)
        await settle(p["scheduler"], "usage.metered", 1)
    # same envelope again, as a redelivery from an uncommitted offset would be
    from whetstone.runtime.messaging import encode
    await send(b, "usage.metered", encode(env), env.key)
    async with platform(scheduler) as p:
        await asyncio.sleep(0.5)
        await wait_until(lambda: p["scheduler"].pool.fetchval(
            "SELECT count(*) = 1 FROM inbox WHERE topic = 'usage.metered'"), 20)
        await settle(p["scheduler"], "usage.metered", 1)
        assert await p["scheduler"].pool.fetchval("SELECT jobs FROM tenant_usage") == 1
