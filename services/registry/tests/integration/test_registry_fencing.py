"""Fenced attempts in the registry, on the real embedded stack: no model is ever made of the final
checkpoint of an attempt the scheduler fenced, whichever order the fence, the checkpoint and the
verdict arrive in; the newer attempt's checkpoint makes the job's one model."""

from __future__ import annotations

from datetime import UTC, datetime

from whetstone.contracts import CheckpointWrittenV1, EvalCompletedV1, JobQueuedV1, Metric, NodeFencedV1, Resources, \
    TrainingSpec
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.registry.bootstrap import build_service
from whetstone.registry.domain.stages import model_id_for

TENANT = "demo"


def _events(kit, rt, job_id: str, attempt: int) -> tuple[CheckpointWrittenV1, EvalCompletedV1]:
    uri, digest = kit.upload_artifact(rt.store, TENANT, job_id, name=f"step-5-final-a{attempt}")
    final = CheckpointWrittenV1(job_id=job_id, segment_id=f"{job_id}-s{attempt}", checkpoint_id=f"c{attempt}",
                                kind="final", step=5, attempt=attempt, uri=uri, manifest_sha256=digest, files=4,
                                size_bytes=1, written_at=datetime.now(UTC))
    verdict = EvalCompletedV1(job_id=job_id, checkpoint_uri=uri, verdict="passed", reasons=["ok"],
                              metrics=[Metric(name="holdout_loss", base=2.0, candidate=1.9)])
    return final, verdict


async def _queue(b: str, kit, job_id: str) -> None:
    spec = TrainingSpec(base_model=kit.BASE, base_model_sha256=kit.BASE_SHA, dataset_id="ds-1", dataset_version="b" * 64,
                        train_uri="s3://whetstone/x", method="lora", hyperparameters={"n_epochs": 1},
                        hyperparameters_hash="c" * 64)
    await send_event(b, JobQueuedV1(job_id=job_id, tier="standard", spec=spec,
                                    resources=Resources(gpu_type="cpu", gpus_per_node=1)), TENANT)


def _fence(job_id: str) -> NodeFencedV1:
    return NodeFencedV1(job_id=job_id, node_id="node-a", segment_id=f"{job_id}-s1", attempt=1, reason="node_lost")


async def _model(rt, job_id: str):
    return await rt.pool.fetchrow("SELECT artifact_uri FROM models WHERE model_id = $1", model_id_for(job_id))


async def _attempt_2_makes_the_model(kit, rt, b: str, job_id: str, *, verdict_first: bool) -> CheckpointWrittenV1:
    fresh, verdict = _events(kit, rt, job_id, 2)
    for event in ((verdict, fresh) if verdict_first else (fresh, verdict)):
        await send_event(b, event, TENANT)
    model = await wait_until(lambda: _model(rt, job_id), 60, f"the model of {job_id}'s attempt 2")
    assert model["artifact_uri"] == fresh.uri
    return fresh


async def test_no_model_is_made_of_a_fenced_attempts_checkpoint_in_any_order(platform, kit):
    async with platform(build_service) as p:
        rt, b = p["registry"], p.settings.kafka_bootstrap
        # 1. the fence first: the woken node's late final checkpoint is refused with the reason
        await _queue(b, kit, "job-f")
        await send_event(b, _fence("job-f"), TENANT)
        stale, stale_verdict = _events(kit, rt, "job-f", 1)
        await send_event(b, stale_verdict, TENANT)
        await send_event(b, stale, TENANT)

        async def refused():
            return [e for e in await outbox(rt, "checkpoint.written.dlq") if "stale_attempt" in str(e)]
        await wait_until(refused, 60, "the stale checkpoint dead-lettered")
        assert await _model(rt, "job-f") is None
        await _attempt_2_makes_the_model(kit, rt, b, "job-f", verdict_first=False)

        # 2. the stale checkpoint first, then the fence, then its verdict: dropped, no model from it
        await _queue(b, kit, "job-g")
        stale, stale_verdict = _events(kit, rt, "job-g", 1)
        await send_event(b, stale, TENANT)
        await wait_until(lambda: rt.pool.fetchval("SELECT 1 FROM final_checkpoints WHERE job_id = 'job-g'"), 60,
                         "the checkpoint recorded")
        await send_event(b, _fence("job-g"), TENANT)
        await wait_until(lambda: rt.pool.fetchval("SELECT 1 FROM fences WHERE job_id = 'job-g'"), 60, "the fence")
        assert await rt.pool.fetchval("SELECT count(*) FROM final_checkpoints WHERE job_id = 'job-g'") == 0
        await send_event(b, stale_verdict, TENANT)
        await wait_until(lambda: rt.pool.fetchval("SELECT 1 FROM evals WHERE job_id = 'job-g'"), 60, "the verdict")
        assert await _model(rt, "job-g") is None
        # 3. the newer attempt's verdict before its checkpoint: the model is made of attempt 2 only
        fresh = await _attempt_2_makes_the_model(kit, rt, b, "job-g", verdict_first=True)
        # a redelivered stale checkpoint now is refused too (attempt 2 superseded it)
        await send_event(b, stale, TENANT)

        async def twice():
            return len(await refused()) >= 2
        await wait_until(twice, 60, "the stale checkpoint refused after the newer one")
        assert (await _model(rt, "job-g"))["artifact_uri"] == fresh.uri
