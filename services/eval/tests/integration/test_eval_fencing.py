"""Fenced attempts in eval, on the real embedded stack: the scheduler gave up on an attempt's node and
moved the job on; the stale attempt's final checkpoint never reaches the gate, a run of it that was
already under way publishes nothing, and the newer attempt's checkpoint gets its own run."""

from datetime import UTC, datetime

import pytest
from whetstone.contracts import (
    CheckpointWrittenV1,
    EvalCompletedV1,
    JobQueuedV1,
    NodeFencedV1,
    Resources,
    TrainingSpec,
)
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.eval.adapters.repository import EvalStore, LeaseLost
from whetstone.eval.bootstrap import build_service
from whetstone.eval.config import EvalSettings
from whetstone.eval.domain.runs import Claim

pytestmark = pytest.mark.integration
TENANT = "acme"


def _final(job_id: str, attempt: int) -> CheckpointWrittenV1:
    # a manifest hash nothing matches: the gate answers at its first stage (no model is loaded)
    return CheckpointWrittenV1(job_id=job_id, segment_id=f"{job_id}-s{attempt}", checkpoint_id=f"c{attempt}",
                               kind="final", step=5, attempt=attempt, files=2, size_bytes=1, manifest_sha256="0" * 64,
                               uri=f"s3://whetstone/tenants/{TENANT}/jobs/{job_id}/checkpoints/step-5-final-a{attempt}",
                               written_at=datetime.now(UTC))


async def _queue(b: str, job_id: str) -> None:
    spec = TrainingSpec(base_model="tiny-llama", base_model_sha256="a" * 64, dataset_id="ds", dataset_version="v",
                        train_uri="s3://whetstone/t", method="lora", hyperparameters={}, hyperparameters_hash="h")
    await send_event(b, JobQueuedV1(job_id=job_id, tier="standard", spec=spec,
                                    resources=Resources(gpu_type="cpu", gpus_per_node=1)), TENANT)


async def _answers(rt, job_id: str) -> list[dict]:
    return [e["payload"] for e in await outbox(rt, "eval.completed") if e["payload"]["job_id"] == job_id]


async def test_a_fenced_attempts_checkpoint_is_refused_and_the_next_attempt_is_evaluated(platform, settings):
    b = settings.kafka_bootstrap
    async with platform(lambda: build_service(EvalSettings(lease_s=3, poll_s=0.2))) as p:
        rt = p["eval"]
        await _queue(b, "job-f")
        await send_event(b, NodeFencedV1(job_id="job-f", node_id="node-a", segment_id="job-f-s1", attempt=1,
                                         reason="node_lost"), TENANT)
        await wait_until(lambda: rt.pool.fetchval("SELECT attempt FROM fences WHERE job_id = 'job-f'"), 60, "fence")
        await send_event(b, _final("job-f", 1), TENANT)          # the woken node's late result

        async def refused():
            return [e for e in await outbox(rt, "checkpoint.written.dlq") if "stale_attempt" in str(e)]
        await wait_until(refused, 60, "the stale checkpoint dead-lettered")
        assert await rt.pool.fetchval("SELECT count(*) FROM eval_runs WHERE job_id = 'job-f'") == 0

        await send_event(b, _final("job-f", 2), TENANT)
        (answer,) = await wait_until(lambda: _answers(rt, "job-f"), 120, "eval.completed of attempt 2")
        assert answer["checkpoint_uri"].endswith("final-a2")
        assert await rt.pool.fetchval("SELECT run_id FROM eval_runs WHERE job_id = 'job-f'") == "job-f~a2"
        await send_event(b, _final("job-f", 1), TENANT)          # a redelivery of the stale one: refused again
        await wait_until(lambda: _count(refused, 2), 60, "the stale checkpoint refused again")
        assert len(await _answers(rt, "job-f")) == 1


async def _count(found, n: int) -> bool:
    return len(await found()) >= n


async def test_a_run_under_way_when_its_attempt_is_fenced_publishes_nothing(platform, settings):
    b = settings.kafka_bootstrap
    async with platform(lambda: build_service(EvalSettings(lease_s=30, poll_s=0.2))) as p:
        rt = p["eval"]
        await _queue(b, "job-g")
        await wait_until(lambda: rt.pool.fetchval("SELECT 1 FROM jobs WHERE job_id = 'job-g'"), 60, "job projected")
        stale = _final("job-g", 1)
        # as a worker left it mid-evaluation: attempt 1's checkpoint kept, its run claimed under a live lease
        await rt.pool.execute("INSERT INTO final_checkpoints (job_id, tenant_id, uri, manifest_sha256, trace_id,"
                              " attempt) VALUES ('job-g', $1, $2, $3, 't', 1)", TENANT, stale.uri,
                              stale.manifest_sha256)
        await rt.pool.execute("INSERT INTO eval_runs (run_id, job_id, tenant_id, status, attempts, lease_owner,"
                              " lease_until) VALUES ('job-g', 'job-g', $1, 'running', 1, 'worker-x',"
                              " now() + interval '30 seconds')", TENANT)
        await send_event(b, NodeFencedV1(job_id="job-g", node_id="node-a", segment_id="job-g-s1", attempt=1,
                                         reason="node_lost"), TENANT)

        async def superseded():
            return await rt.pool.fetchval("SELECT status FROM eval_runs WHERE run_id = 'job-g'") == "superseded"
        await wait_until(superseded, 60, "the fenced attempt's run superseded")
        assert await rt.pool.fetchval("SELECT count(*) FROM final_checkpoints WHERE job_id = 'job-g'") == 0
        # the worker that held it finishes its scoring: its lease is gone, nothing is recorded or published
        claim = Claim("job-g", TENANT, 1, "worker-x", job_id="job-g")
        scored = EvalCompletedV1(job_id="job-g", checkpoint_uri=stale.uri, verdict="passed", reasons=[], metrics=[])
        with pytest.raises(LeaseLost):
            async with rt.pool.acquire() as conn, conn.transaction():
                await EvalStore(conn).finish(claim, scored, lineage_key="k",
                                             adapter_manifest_sha256=stale.manifest_sha256)
        # had it kept its lease (the fence not known yet), the checkpoint it scored is no longer the job's
        await rt.pool.execute("UPDATE eval_runs SET status = 'running', lease_owner = 'worker-x' WHERE run_id = 'job-g'")
        async with rt.pool.acquire() as conn, conn.transaction():
            assert not await EvalStore(conn).finish(claim, scored, lineage_key="k",
                                                    adapter_manifest_sha256=stale.manifest_sha256)
        assert await rt.pool.fetchval("SELECT status FROM eval_runs WHERE run_id = 'job-g'") == "superseded"
        assert await rt.pool.fetchval("SELECT count(*) FROM results WHERE job_id = 'job-g'") == 0
        await send_event(b, _final("job-g", 2), TENANT)
        (answer,) = await wait_until(lambda: _answers(rt, "job-g"), 120, "eval.completed of attempt 2")
        assert answer["checkpoint_uri"].endswith("final-a2")
