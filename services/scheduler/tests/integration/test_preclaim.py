"""Who may put a job on the bus. No producer can claim another tenant's job id: a `job.requested`
with a valid producer token of its own tenant, naming the job id another tenant's idempotency key
gives (a pre-claim), is dead-lettered as tenant_mismatch and creates no job; the same producer's own
job (its job id derived from its own tenant and key) is admitted. A token signed with the platform's
secret but never issued (no record) and an issued token past its expiry are refused too. Real
embedded stack."""

import pytest
from whetstone.contracts import JobRequestedV1, job_id_for
from whetstone.devstack.testing import producer_token, send_event, wait_until
from whetstone.runtime.identity import internal_secret, mint_producer_token
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration


async def test_a_valid_token_cannot_pre_claim_another_tenants_job_id(platform, settings, tiny_model):
    async with platform(lambda: build_service(SchedulerSettings(node_timeout_s=300))) as p:
        rt = p["scheduler"]
        theirs = job_id_for("demo", "next-key")                 # what demo's next request with that key will be
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=theirs, idempotency_key="next-key", model=tiny_model, training_file="ds-x"),
            "acme", producer_token=await producer_token(rt, "acme"))
        unknown, expired = job_id_for("acme", "unissued-key"), job_id_for("acme", "expired-key")
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=unknown, idempotency_key="unissued-key", model=tiny_model, training_file="ds-x"),
            "acme", producer_token=mint_producer_token("acme", internal_secret(rt.settings.data_dir)))
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=expired, idempotency_key="expired-key", model=tiny_model, training_file="ds-x"),
            "acme", producer_token=await producer_token(rt, "acme", expires_in_s=-1))
        mine = job_id_for("acme", "own-key")
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=mine, idempotency_key="own-key", model=tiny_model, training_file="ds-x"),
            "acme", producer_token=await producer_token(rt, "acme"))

        def refused(reason: str) -> float:
            return rt.metrics.registry.get_sample_value(
                "whetstone_refused_total", {"service": "scheduler", "reason": reason}) or 0

        async def settled():
            own = await rt.pool.fetchval("SELECT tenant_id FROM jobs WHERE job_id = $1", mine)
            reasons = ("tenant_mismatch", "producer_token_unknown", "producer_token_expired")
            return own if own and all(refused(r) >= 1 for r in reasons) else None

        assert await wait_until(settled, 60, "acme's own job and the three refusals") == "acme"
        for refused_id in (theirs, unknown, expired):
            assert await rt.pool.fetchval("SELECT count(*) FROM jobs WHERE job_id = $1", refused_id) == 0
        assert await rt.pool.fetchval("SELECT count(*) FROM owners WHERE id = $1", theirs) == 0
