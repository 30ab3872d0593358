from datetime import UTC, datetime

import httpx
import pytest

from whetstone.contracts import CheckpointWrittenV1, EvalCompletedV1, JobQueuedV1, Metric, Resources, TrainingSpec
from whetstone.registry.bootstrap import build_service
from whetstone.runtime.testing import outbox, send_event, wait_until

pytestmark = pytest.mark.integration


async def test_failed_eval_quarantines_and_tenants_only_see_their_models(platform, settings):
    b = settings.kafka_bootstrap
    spec = TrainingSpec(base_model="tiny-llama", base_model_sha256="a" * 64, dataset_id="ds-1", dataset_version="b" * 64,
                        train_uri="s3://whetstone/x", method="lora", hyperparameters={}, hyperparameters_hash="c" * 64)
    async with platform(build_service) as p:
        # eval arrives first, then the checkpoint, then the job: order across topics must not matter
        await send_event(b, EvalCompletedV1(job_id="j1", checkpoint_uri="s3://x", verdict="failed",
                                            reasons=["holdout loss 2.5 vs base 2.0 (+25.0%)"],
                                            metrics=[Metric(name="holdout_loss", base=2.0, candidate=2.5)]), "acme")
        await send_event(b, CheckpointWrittenV1(job_id="j1", segment_id="j1-s1", checkpoint_id="c", kind="final", step=5,
                                                uri="s3://whetstone/tenants/acme/jobs/j1/checkpoints/final",
                                                manifest_sha256="d" * 64, files=2, size_bytes=1,
                                                written_at=datetime.now(UTC)), "acme")
        await send_event(b, JobQueuedV1(job_id="j1", tier="premium", spec=spec,
                                        resources=Resources(gpu_type="cpu", gpus_per_node=1)), "acme")
        rt = p["registry"]
        promoted = await wait_until(lambda: outbox(rt, "model.promoted"), 30, "promotion")
        assert promoted[0]["payload"]["to_stage"] == "quarantined"
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            mine = (await c.get("/v1/models", headers={"X-Tenant-Id": "acme"})).json()["data"]
            assert mine[0]["stage"] == "quarantined" and mine[0]["lineage"]["eval_verdict"] == "failed"
            assert (await c.get("/v1/models", headers={"X-Tenant-Id": "demo"})).json()["data"] == []
            assert (await c.get(f"/v1/models/{mine[0]['id']}", headers={"X-Tenant-Id": "demo"})).status_code == 404
