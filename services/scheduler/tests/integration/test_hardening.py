"""Issue 20 on the real embedded stack: a lost node is fenced and its segment refunded with a true
basis, a partitioned node that wakes up changes nothing, forged tenants and heartbeats are
dead-lettered, every platform-side state has a timeout, and admission refuses what it can know."""

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, DatasetValidatedV1, JobCompletedV1, JobFailedV1, JobProgressV1, JobStartedV1,
    NodeHeartbeatV1,
)
from whetstone.devstack.testing import consume_all, outbox, send_event, wait_until
from whetstone.metering.bootstrap import build_service as metering
from whetstone.runtime.identity import IdentityAuth
from whetstone.scheduler.adapters.probes import PROBES
from whetstone.scheduler.adapters.store import JobStore

from .test_scheduler_service import assigned, get, heartbeat, node_and_dataset, post, scheduler, validated

pytestmark = pytest.mark.integration


def refused(rt, reason: str) -> float:
    return rt.metrics.registry.get_sample_value("whetstone_refused_total",
                                                {"service": "scheduler", "reason": reason}) or 0.0


def at_least(rt, reason: str, n: float):
    async def check():
        return refused(rt, reason) >= n
    return check


async def letters(bootstrap: str, topic: str) -> list[dict]:
    return [json.loads(v)["payload"] for v in await consume_all(bootstrap, f"{topic}.dlq", timeout=1.0)]


async def test_lost_node_is_fenced_refunded_with_its_checkpoint_and_a_woken_node_changes_nothing(
        platform, settings, tiny_model):
    b = settings.kafka_bootstrap
    async with platform(scheduler(node_timeout_s=3.0, lost_node_check_s=0.5), metering) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        alive = {"n1"}

        async def beat():
            while True:
                for node in sorted(alive):
                    await heartbeat(settings, node)
                await asyncio.sleep(0.7)
        beats = asyncio.create_task(beat())
        try:
            await validated(settings, "demo")
            await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")
            job = (await post(c, "demo", "fence")).json()
            (seg1,) = await assigned(rt, job["id"])
            assert seg1["node_id"] == "n1" and seg1["attempt"] == 1
            started = datetime.now(UTC) - timedelta(seconds=30)
            written = started + timedelta(seconds=20)
            await send_event(b, JobStartedV1(job_id=job["id"], node_id="n1", segment_id=seg1["segment_id"], attempt=1,
                                             gpu_type="cpu", gpu_count=1, started_at=started), "demo")
            await send_event(b, CheckpointWrittenV1(
                job_id=job["id"], segment_id=seg1["segment_id"], attempt=1, checkpoint_id="c5", kind="periodic",
                step=5, uri="s3://whetstone/tenants/demo/jobs/x/checkpoints/step-5", manifest_sha256="1" * 64,
                files=1, size_bytes=1, written_at=written), "demo")
            # forged: another tenant fails demo's job; a tenant's heartbeat speaks for a platform node
            await send_event(b, JobFailedV1(job_id=job["id"], segment_id=seg1["segment_id"], attempt=1,
                                            error_class="user", code="forged", message="forged"), "acme")
            await send_event(b, NodeHeartbeatV1(node_id="n1", gpu_type="cpu", gpu_count=8, sent_at=datetime.now(UTC)),
                             "acme")
            await wait_until(at_least(rt, "tenant_mismatch", 2), 30, "forged events refused")
            view = await wait_until(lambda: _checkpointed(c, job["id"]), 30, "checkpoint recorded")
            assert view["state"] == "running" and view["error"] is None

            alive = {"n2"}                                # n1 goes silent (partitioned)
            seg2 = (await assigned(rt, job["id"], 2))[1]
        finally:
            beats.cancel()
        assert seg2["node_id"] == "n2" and seg2["attempt"] == 2 and seg2["resume_from"]["step"] == 5

        # the lost segment's refund basis: what it checkpointed, and when
        (lost,) = [e["payload"] for e in await outbox(rt, "job.preempted")]
        assert lost["reason"] == "node_lost" and lost["attempt"] == 1 and lost["segment_id"] == seg1["segment_id"]
        assert datetime.fromisoformat(lost["checkpointed_at"]) == written and lost["checkpoint"]["step"] == 5
        line = await wait_until(lambda: p["metering"].pool.fetchrow(
            "SELECT charge_class, basis FROM ledger WHERE segment_id = $1", seg1["segment_id"]), 30, "metered")
        assert line["charge_class"] == "refunded", line      # 20 of the segment's GPU-s were checkpointed
        assert line["basis"].startswith("preempted (node_lost): 20 of"), line
        (fence,) = [e["payload"] for e in await outbox(rt, "node.fenced")]
        assert fence == {**fence, "job_id": job["id"], "node_id": "n1", "attempt": 1, "reason": "node_lost"}

        # the partitioned node wakes up and carries on with attempt 1: refused, nothing changes
        stale = refused(rt, "stale_attempt")
        s1 = seg1["segment_id"]
        await send_event(b, JobProgressV1(job_id=job["id"], segment_id=s1, attempt=1, step=7, loss=0.1), "demo")
        await send_event(b, CheckpointWrittenV1(
            job_id=job["id"], segment_id=s1, attempt=1, checkpoint_id="c9", kind="periodic", step=9,
            uri="s3://whetstone/tenants/demo/jobs/x/checkpoints/step-9", manifest_sha256="2" * 64, files=1,
            size_bytes=1, written_at=datetime.now(UTC)), "demo")
        await send_event(b, JobCompletedV1(job_id=job["id"], segment_id=s1, node_id="n1", stopped_at=datetime.now(UTC),
                                           steps=10, final_checkpoint=CheckpointRef(uri="s3://x", step=10,
                                                                                    manifest_sha256="3" * 64)), "demo")
        await send_event(b, NodeHeartbeatV1(node_id="n1", gpu_type="cpu", gpu_count=1, running_jobs=[job["id"]],
                                            sent_at=datetime.now(UTC)), "platform")
        await wait_until(at_least(rt, "stale_attempt", stale + 3), 30, "stale attempt refused")
        await wait_until(at_least(rt, "foreign_job_claim", 1), 30, "foreign claim refused")
        view = await get(c, "demo", job["id"])
        assert view["state"] == "provisioning" and view["node_id"] == "n2" and view["attempt"] == 2
        assert view["fenced_attempt"] == 1 and view["latest_checkpoint"]["step"] == 5 and not view["progress"].get("step")
        assert await rt.pool.fetchval("SELECT lost FROM nodes WHERE node_id = 'n1'")
        (letter,) = await letters(b, "checkpoint.written")       # with the reason, for the operator
        assert "stale_attempt" in letter["error"] and "fenced" in letter["error"], letter
        assert any("tenant_mismatch" in x["error"] for x in await letters(b, "job.failed"))


async def _checkpointed(c, job_id):
    view = await get(c, "demo", job_id)
    return view if (view["latest_checkpoint"] or {}).get("step") == 5 else None


async def test_every_platform_side_state_times_out_into_a_requeue_or_a_named_failure(platform, settings, tiny_model):
    b = settings.kafka_bootstrap
    async with platform(scheduler(node_timeout_s=300, provisioning_timeout_s=1.5, evaluating_timeout_s=1.0,
                                  timeout_check_s=0.2)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        await node_and_dataset(settings, rt)
        stuck = (await post(c, "demo", "never-starts")).json()

        async def failed(job_id):
            view = await get(c, "demo", job_id)
            return view if view["state"] == "failed" else None
        # the node never starts it: re-queued twice (platform_timeout), then failed as the platform's fault
        view = await wait_until(lambda: failed(stuck["id"]), 60, "provisioning timeouts")
        assert view["error"]["code"] == "provisioning_timeout" and view["error"]["error_class"] == "platform"
        assert view["attempt"] == 3 and view["fenced_attempt"] == 3 and view["timeouts"] == 3
        lost = [e["payload"] for e in await outbox(rt, "job.preempted")]
        assert [(x["reason"], x["attempt"]) for x in lost] == [("platform_timeout", n) for n in (1, 2, 3)]
        assert len(await outbox(rt, "node.fenced")) == 3
        (end,) = [e["payload"] for e in await outbox(rt, "job.failed")]
        assert end["error_class"] == "platform" and end["code"] == "provisioning_timeout"

        # training succeeds, but no eval verdict ever comes
        evaluated = (await post(c, "demo", "no-verdict")).json()
        (seg,) = await assigned(rt, evaluated["id"])
        await send_event(b, JobCompletedV1(job_id=evaluated["id"], segment_id=seg["segment_id"], attempt=1,
                                           node_id="n1", stopped_at=datetime.now(UTC), steps=4,
                                           final_checkpoint=CheckpointRef(uri="s3://x", step=4,
                                                                          manifest_sha256="4" * 64)), "demo")
        view = await wait_until(lambda: failed(evaluated["id"]), 30, "evaluating timeout")
        assert view["error"]["code"] == "evaluating_timeout" and view["error"]["error_class"] == "platform"


async def test_a_jobs_age_in_its_state_counts_from_the_state_change_not_its_last_progress(
        platform, settings, tiny_model):
    b = settings.kafka_bootstrap
    async with platform(scheduler(node_timeout_s=300)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        await node_and_dataset(settings, rt)
        job = (await post(c, "demo", "aging")).json()
        (seg,) = await assigned(rt, job["id"])
        await send_event(b, JobStartedV1(job_id=job["id"], node_id="n1", segment_id=seg["segment_id"], attempt=1,
                                         gpu_type="cpu", gpu_count=1, started_at=datetime.now(UTC)), "demo")
        row = "SELECT status, state_since, updated_at, progress FROM jobs WHERE job_id = $1"

        async def in_state(status, step=None):
            r = await rt.pool.fetchrow(row, job["id"])
            return r if r["status"] == status and r["progress"].get("step") == step else None
        running = await wait_until(lambda: in_state("running"), 30, "running")
        await asyncio.sleep(1.5)
        await send_event(b, JobProgressV1(job_id=job["id"], segment_id=seg["segment_id"], attempt=1, step=3,
                                          loss=0.5), "demo")
        later = await wait_until(lambda: in_state("running", 3), 30, "progress recorded")
        assert later["updated_at"] > running["updated_at"] and later["state_since"] == running["state_since"]
        (probe,) = [x for x in PROBES if x.metric == "whetstone_job_state_age_seconds"]
        ages = {state: age for state, age in await rt.pool.fetch(probe.sql)}
        assert ages["running"] >= 1.5, ages                   # not reset by the progress report


def _tiny(settings) -> Path:
    from whetstone.modelkit.tiny import build_tiny_model

    return build_tiny_model(Path(settings.model_catalog) / "tiny-1024")


async def test_admission_refuses_what_it_can_know_and_fits_defaults_to_the_model(platform, settings):
    from whetstone.trainer_agent.recipes.modeling import (
        check_sequence_length,
        load_base_config,
    )

    building = asyncio.create_task(asyncio.to_thread(_tiny, settings))   # the real tiny Llama: context 1024
    b = settings.kafka_bootstrap
    async with platform(scheduler(node_timeout_s=300)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        model_dir = await building
        await heartbeat(settings, "n1")
        for ds, schema, purpose in (("ds-chat", "chat", "sft"), ("ds-pref", "preference", "dpo")):
            await send_event(b, DatasetValidatedV1(
                dataset_id=ds, version="cd" * 32, name="d.jsonl", status="accepted", purpose=purpose,
                data_schema=schema, rows_total=20, rows_kept=20, tokens_total=2000,
                train_uri=f"s3://whetstone/tenants/demo/datasets/{ds}/train.jsonl"), "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 2 FROM datasets"), 30, "datasets")

        # no max_seq_len: fitted to the model's context instead of 2048, which the node would refuse
        ok = await post(c, "demo", "fit", model="tiny-1024", training_file="ds-chat", suffix="support-bot")
        assert ok.status_code == 200, ok.text
        (queued,) = [e["payload"] for e in await wait_until(lambda: outbox(rt, "job.queued"), 30, "queued")]
        assert queued["spec"]["hyperparameters"]["max_seq_len"] == 1024 and queued["suffix"] == "support-bot"
        config = load_base_config(str(model_dir))
        check_sequence_length(config, queued["spec"]["hyperparameters"]["max_seq_len"])   # the node accepts it
        with pytest.raises(Exception, match="exceeds the base model's context"):
            check_sequence_length(config, 2048)                                           # the old default

        async def refusal(key, **body):
            r = await post(c, "demo", key, model="tiny-1024", **body)
            assert r.status_code == 400, r.text
            return r.json()["error"]
        e = await refusal("long", training_file="ds-chat", hyperparameters={"max_seq_len": 4096})
        assert e["param"] == "hyperparameters.max_seq_len" and "1024" in e["message"]
        e = await refusal("rank", training_file="ds-chat", hyperparameters={"lora_r": 128})
        assert e["param"] == "hyperparameters.lora_r" and "64" in e["message"]
        e = await refusal("dpo-on-chat", training_file="ds-chat", method="dpo")
        assert e["param"] == "training_file" and e["code"] == "method_dataset_mismatch" and "preference" in e["message"]
        e = await refusal("sft-on-pref", training_file="ds-pref", method="lora")
        assert e["param"] == "training_file" and "preference data" in e["message"]

        # the data's verdict comes later: the job fails naming the field, before any GPU time
        later = (await post(c, "demo", "later", model="tiny-1024", training_file="ds-later", method="dpo")).json()
        assert later["status"] == "validating_files"
        await send_event(b, DatasetValidatedV1(
            dataset_id="ds-later", version="ef" * 32, name="d.jsonl", status="accepted", data_schema="chat",
            rows_total=20, rows_kept=20, train_uri="s3://whetstone/tenants/demo/datasets/ds-later/train.jsonl"), "demo")

        async def failed():
            view = await get(c, "demo", later["id"])
            return view if view["state"] == "failed" else None
        view = await wait_until(failed, 30, "mismatch failure")
        assert view["error"]["param"] == "training_file" and view["error"]["code"] == "method_dataset_mismatch"
        assert not [e for e in await outbox(rt, "job.assigned") if e["payload"]["job_id"] == later["id"]]
        assert (await c.get(f"/v1/fine_tuning/jobs/{later['id']}", auth=IdentityAuth("demo"))).status_code == 200


async def test_a_job_whose_dataset_verdict_landed_unseen_is_queued_not_failed_as_the_users_error(platform, settings,
                                                                                                tiny_model):
    """The race the chaos suite found: `dataset.validated` commits while the job is being created, so
    the handler's look for waiting jobs misses it and the job's own read missed the verdict. Here the
    verdict is written straight into the table (no handler, no wake): the watcher must queue the job,
    not fail it after `dataset_wait_s` as `training_file_not_validated`."""
    async with platform(scheduler(unknown_dataset_grace_s=1.0, dataset_wait_s=30.0)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        await heartbeat(settings, "n1")
        job = (await post(c, "demo", "unseen")).json()
        assert job["state"] == "validating_files", job
        await rt.pool.execute("INSERT INTO dataset_submissions (tenant_id, dataset_id, submitted_at)"
                              " VALUES ('demo', 'ds-1', now()) ON CONFLICT DO NOTHING")
        verdict = DatasetValidatedV1(dataset_id="ds-1", version="cd" * 32, name="d.jsonl", status="accepted",
                                     rows_total=200, rows_kept=200, tokens_total=5000,
                                     train_uri="s3://whetstone/tenants/demo/datasets/ds-1/train.jsonl")
        async with rt.uow() as uow:
            await JobStore(uow).dataset_validated("demo", verdict)

        async def moved_on():
            state = (await get(c, "demo", job["id"]))["state"]
            return state if state != "validating_files" else None
        state = await wait_until(moved_on, 20, "the job to leave validating_files")
        assert state in ("queued", "running", "provisioning", "assigned"), state
