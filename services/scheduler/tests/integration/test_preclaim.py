"""No producer can claim another tenant's job id: a `job.requested` with a
valid producer token of its own tenant, naming the job id another tenant's idempotency key gives
(a pre-claim), is dead-lettered as tenant_mismatch and creates no job; the same producer's own job
(its job id derived from its own tenant and key) is admitted. Real embedded stack."""

import pytest
from whetstone.contracts import JobRequestedV1, job_id_for
from whetstone.devstack.testing import producer_token, send_event, wait_until
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration


async def test_a_valid_token_cannot_pre_claim_another_tenants_job_id(platform, settings, tiny_model):
    async with platform(lambda: build_service(SchedulerSettings(node_timeout_s=300))) as p:
        rt = p["scheduler"]
        theirs = job_id_for("demo", "next-key")                 # what demo's next request with that key will be
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=theirs, idempotency_key="next-key", model=tiny_model, training_file="ds-x"),
            "acme", producer_token=producer_token("acme"))
        mine = job_id_for("acme", "own-key")
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=mine, idempotency_key="own-key", model=tiny_model, training_file="ds-x"),
            "acme", producer_token=producer_token("acme"))

        def refused() -> float:
            return rt.metrics.registry.get_sample_value(
                "whetstone_refused_total", {"service": "scheduler", "reason": "tenant_mismatch"}) or 0

        async def settled():
            own = await rt.pool.fetchval("SELECT tenant_id FROM jobs WHERE job_id = $1", mine)
            return own if own and refused() >= 1 else None

        assert await wait_until(settled, 60, "acme's own job and the refusal") == "acme"
        assert await rt.pool.fetchval("SELECT count(*) FROM jobs WHERE job_id = $1", theirs) == 0
        assert await rt.pool.fetchval("SELECT count(*) FROM owners WHERE id = $1", theirs) == 0
