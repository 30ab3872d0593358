"""The official `openai` client drives the scheduler's job API unchanged (on the service port, with
the identity the gateway would sign): method objects, OpenAI statuses, auto-pagination, events
newest first and live as SSE, checkpoints with metrics, eval stages, the registered model's name,
idempotency with and without a key, and another tenant's 404."""

import json
from datetime import UTC, datetime

import httpx
import openai
import pytest

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, DatasetValidatedV1, EvalCompletedV1, EvalStageResult, JobCompletedV1,
    JobProgressV1, JobStartedV1, Lineage, ModelRegisteredV1, NodeHeartbeatV1,
)
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration


def client(p, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=p.url("scheduler") + "/v1", api_key="unused-on-a-service-port",
                              http_client=httpx.AsyncClient(auth=IdentityAuth(tenant, ("read", "write")), timeout=60), max_retries=0)


async def dataset(settings, dataset_id: str, purpose: str) -> None:
    await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
        dataset_id=dataset_id, version="cd" * 32, name="d.jsonl", status="accepted", purpose=purpose, rows_total=20,
        rows_kept=20, tokens_total=4000, train_uri=f"s3://whetstone/tenants/demo/datasets/{dataset_id}/train.jsonl"),
        "demo")


async def test_the_openai_client_drives_jobs_events_checkpoints_and_cancel(platform, settings, tiny_model):
    NOW = datetime.now(UTC)   # at run time: a heartbeat stamped at import goes stale in a long suite
    async with platform(lambda: build_service(SchedulerSettings(node_timeout_s=300))) as p:
        rt, b = p["scheduler"], settings.kafka_bootstrap
        api, other = client(p, "demo"), client(p, "acme")
        await send_event(b, NodeHeartbeatV1(node_id="cpu-1", gpu_type="cpu", gpu_count=1, gpu_memory_gb=0,
                                            free_gpu_ids=[0], sent_at=NOW), "platform")
        await dataset(settings, "file-sft", "sft")
        await dataset(settings, "file-pref", "dpo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 2 FROM datasets"), 30, "datasets")

        sft = await api.fine_tuning.jobs.create(
            model=tiny_model, training_file="file-sft", seed=7, suffix="mine", metadata={"team": "nlp"},
            method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": "auto"}}},
            extra_body={"eval_config": {"stages": ["holdout"]}})
        assert sft.object == "fine_tuning.job" and sft.status == "queued" and sft.organization_id == "demo"
        assert sft.method.type == "supervised" and sft.method.supervised.hyperparameters.n_epochs == 2
        assert sft.seed == 7 and sft.metadata == {"team": "nlp"} and sft.user_provided_suffix == "mine"
        assert sft.integrations == [] and sft.result_files == [] and sft.error is None
        dpo = await api.fine_tuning.jobs.create(
            model=tiny_model, training_file="file-pref",
            method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}})
        assert dpo.method.type == "dpo" and dpo.method.dpo.hyperparameters.beta == 0.2
        # no Idempotency-Key: a new job each call; with one: the same job
        again = await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-pref", method={"type": "dpo"})
        assert again.id not in (dpo.id, sft.id)
        keyed = [await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-sft",
                                                   extra_headers={"Idempotency-Key": "same"}) for _ in range(2)]
        assert keyed[0].id == keyed[1].id
        with pytest.raises(openai.ConflictError) as conflict:
            await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-pref", method={"type": "dpo"},
                                              extra_headers={"Idempotency-Key": "same"})
        assert conflict.value.response.headers["x-should-retry"] == "false"
        with pytest.raises(openai.BadRequestError) as bad:
            await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-sft",
                                              method={"type": "supervised", "supervised": {
                                                  "hyperparameters": {"learning_rate_multiplier": -1}}})
        assert bad.value.body["param"] == "method.supervised.hyperparameters.learning_rate_multiplier"

        # the job the loop placed runs: progress, a checkpoint with its metrics, completion, eval, model
        seg = await wait_until(lambda: _assignment(rt, sft.id), 30, "assignment")
        await send_event(b, JobStartedV1(job_id=sft.id, node_id="cpu-1", segment_id=seg, attempt=1, gpu_type="cpu",
                                         gpu_count=1, started_at=NOW, total_steps=20), "demo")
        await send_event(b, JobProgressV1(job_id=sft.id, segment_id=seg, step=10, total_steps=20, loss=1.25), "demo")
        # separate topics arrive in any order: each step waits for the one before it
        await wait_until(lambda: _step(api, sft.id, 10), 30, "progress")
        ck = CheckpointRef(uri="s3://whetstone/tenants/demo/jobs/x/checkpoints/final", step=10,
                           manifest_sha256="0" * 64)
        await send_event(b, CheckpointWrittenV1(job_id=sft.id, segment_id=seg, checkpoint_id="ckpt-10", kind="final",
                                                step=10, uri=ck.uri, manifest_sha256=ck.manifest_sha256, files=3,
                                                size_bytes=9, written_at=NOW, metrics={"valid_loss": 1.5}), "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM job_checkpoints"), 30, "checkpoint")
        await send_event(b, JobCompletedV1(job_id=sft.id, segment_id=seg, node_id="cpu-1", stopped_at=NOW, steps=10,
                                           tokens=4000, final_checkpoint=ck), "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT status = 'evaluating' FROM jobs WHERE job_id = $1", sft.id),
                         30, "evaluating")
        stages = [EvalStageResult(name="holdout", status="passed", reason="loss 1.5 < 2.0"),
                  EvalStageResult(name="safety", status="skipped", reason="not configured")]
        await send_event(b, EvalCompletedV1(job_id=sft.id, checkpoint_uri=ck.uri, verdict="passed", reasons=["ok"],
                                            metrics=[], stages=stages), "demo")
        await send_event(b, ModelRegisteredV1(
            model_id="mdl-1", name="tiny-llama-mine-1", stage="staging", artifact_uri=ck.uri, artifact_sha256="1" * 64,
            lineage=Lineage(job_id=sft.id, base_model="tiny-llama", base_model_sha256="2" * 64, dataset_id="file-sft",
                            dataset_version="cd" * 32, method="lora", hyperparameters_hash="3" * 64)), "demo")

        async def done():
            job = await api.fine_tuning.jobs.retrieve(sft.id)
            return job if job.fine_tuned_model and job.status == "succeeded" else None   # two topics: any order
        job = await wait_until(done, 30, "evaluated and registered")
        assert job.status == "succeeded" and job.fine_tuned_model == "tiny-llama-mine-1" and job.trained_tokens == 4000
        view = job.model_dump()
        assert view["eval"]["verdict"] == "passed" and [s["name"] for s in view["eval"]["stages"]] == ["holdout",
                                                                                                      "safety"]
        assert view["state"] == "succeeded" and isinstance(job.finished_at, int)

        events = [e async for e in api.fine_tuning.jobs.list_events(sft.id, limit=2)]   # auto-paginates
        assert [e.created_at for e in events] == sorted((e.created_at for e in events), reverse=True)
        assert len({e.id for e in events}) == len(events) and all(e.object == "fine_tuning.job.event" for e in events)
        metrics = [e for e in events if e.type == "metrics"]
        assert metrics and metrics[0].data["step"] == 10 and metrics[0].data["loss"] == 1.25
        assert any("eval stage safety: skipped" in e.message for e in events)
        (ckpt,) = [c async for c in api.fine_tuning.jobs.checkpoints.list(sft.id)]
        assert ckpt.step_number == 10 and ckpt.metrics.train_loss == 1.25 and ckpt.fine_tuning_job_id == sft.id
        assert ckpt.fine_tuned_model_checkpoint == "tiny-llama-mine-1:ckpt-step-10"

        # live events as server-sent events, ending once the job is over
        async with httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
            async with c.stream("GET", f"/v1/fine_tuning/jobs/{sft.id}/events", params={"stream": "true"},
                                auth=IdentityAuth("demo")) as r:
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            raw = (await c.get(f"/v1/fine_tuning/jobs/{sft.id}/checkpoints", auth=IdentityAuth("demo"))).json()["data"][0]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["message"].startswith("job created")
        assert list(json.loads(lines[0][6:])) == ["id", "object", "created_at", "level", "message", "type", "data"]
        assert list(raw) == ["id", "object", "created_at", "fine_tuning_job_id", "step_number", "metrics",
                             "fine_tuned_model_checkpoint", "kind", "uri"]
        assert raw["metrics"]["step"] == 10 and isinstance(raw["metrics"]["step"], int)

        # listing pages with has_more; cancel returns the job; another tenant sees nothing
        listed = [j.id async for j in api.fine_tuning.jobs.list(limit=1)]
        assert len(listed) == len(set(listed)) == 4
        cancelled = await api.fine_tuning.jobs.cancel(dpo.id)
        assert cancelled.status == "cancelled"
        with pytest.raises(openai.NotFoundError):
            await other.fine_tuning.jobs.retrieve(sft.id)
        with pytest.raises(openai.NotFoundError):
            await other.fine_tuning.jobs.cancel(again.id)
        assert [j async for j in other.fine_tuning.jobs.list()] == []
        queued_events = [e["payload"] for e in await outbox(rt, "job.queued") if e["payload"]["job_id"] == sft.id]
        assert queued_events[0]["spec"]["eval_config"] == {"stages": ["holdout"]}


async def _step(api, job_id, step):
    return ((await api.fine_tuning.jobs.retrieve(job_id)).model_dump()["progress"] or {}).get("step") == step


async def _assignment(rt, job_id):
    for e in await outbox(rt, "job.assigned"):
        if e["payload"]["job_id"] == job_id:
            return e["payload"]["segment_id"]
    return None
