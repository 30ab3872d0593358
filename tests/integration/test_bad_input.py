"""Bad input at the platform's boundaries: a clear rejection event, no crash, nothing lost."""

import hashlib
import json

import httpx
import pytest

from whetstone.contracts import DatasetSubmittedV1, JobRequestedV1, dataset_id_for, job_id_for
from whetstone.ingest.bootstrap import build_service as ingest
from whetstone.runtime.identity import IdentityAuth
from whetstone.devstack.testing import outbox, producer_token, send_event, wait_until
from whetstone.scheduler.bootstrap import build_service as scheduler
from whetstone.scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration

GOOD = [{"messages": [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i}."}]}
        for i in range(12)]


def jsonl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


async def upload(p, tenant: str, data: bytes) -> DatasetSubmittedV1:
    digest = hashlib.sha256(data).hexdigest()
    uri = p["ingest"].store.put_bytes(f"tenants/{tenant}/uploads/{digest}.jsonl", data)
    return DatasetSubmittedV1(dataset_id=dataset_id_for(digest), name="upload.jsonl", source_uri=uri)


async def verdict(p, dataset_id: str) -> dict:
    async def find():
        for e in await outbox(p["ingest"], "dataset.validated"):
            if e["payload"]["dataset_id"] == dataset_id:
                return e["payload"]
    return await wait_until(find, 30, f"dataset.validated for {dataset_id}")


async def test_broken_dataset_is_rejected_with_line_numbers_and_its_job_fails(platform, settings, fake_model):
    data = jsonl(GOOD[:11]) + b'{"messages": [{"role": "user", "content": "x"}\n' + jsonl(
        [{"messages": [{"role": "assistant", "content": "first"}]}])
    async with platform(ingest, scheduler) as p:
        sub = await upload(p, "demo", data)
        async with httpx.AsyncClient(base_url=p.url("scheduler")) as c:
            r = await c.post("/v1/fine_tuning/jobs", json={"model": fake_model, "training_file": sub.dataset_id},
                             auth=IdentityAuth("demo"), headers={"Idempotency-Key": "bad-data"})
            job_id = r.json()["id"]
            await send_event(settings.kafka_bootstrap, sub, "demo")
            v = await verdict(p, sub.dataset_id)
            assert v["status"] == "rejected"
            by_line = {e["line"]: e["code"] for e in v["errors"]}
            assert by_line[12] == "invalid_json" and by_line[13] == "role_order"

            async def failed():
                j = (await c.get(f"/v1/fine_tuning/jobs/{job_id}", auth=IdentityAuth("demo"))).json()
                return j if j["status"] == "failed" else None
            job = await wait_until(failed, 30, "job failed")
            assert job["error"]["code"] == "invalid_training_file" and "line 12" in job["error"]["message"]


async def test_unknown_tenant_and_foreign_prefix_are_rejected(platform, settings):
    async with platform(ingest) as p:
        good = await upload(p, "demo", jsonl(GOOD))
        await send_event(settings.kafka_bootstrap, good, "nobody")      # unknown tenant
        await send_event(settings.kafka_bootstrap, good, "acme")        # acme pointing into demo's prefix
        found = await wait_until(lambda: _codes(p), 30, "two rejections")
        assert {"unknown_tenant", "source_outside_tenant"} <= found


async def _codes(p):
    codes = {e["code"] for ev in await outbox(p["ingest"], "dataset.validated") for e in ev["payload"]["errors"]}
    return codes if len(codes) >= 2 else None


async def test_job_for_a_dataset_that_never_arrives_fails_with_a_reason(platform, settings, fake_model):
    async with platform(lambda: scheduler(SchedulerSettings(dataset_wait_s=2.0, unknown_dataset_grace_s=1.0))) as p:
        async with httpx.AsyncClient(base_url=p.url("scheduler")) as c:
            r = await c.post("/v1/fine_tuning/jobs", json={"model": fake_model, "training_file": "ds-missing"},
                             auth=IdentityAuth("demo"), headers={"Idempotency-Key": "k"})
            job_id = r.json()["id"]

            async def failed():
                j = (await c.get(f"/v1/fine_tuning/jobs/{job_id}", auth=IdentityAuth("demo"))).json()
                return j if j["status"] == "failed" else None
            job = await wait_until(failed, 30, "expiry")
            assert job["error"]["code"] == "unknown_training_file" and "ds-missing" in job["error"]["message"]


async def test_job_requests_over_kafka_from_unknown_tenants_or_for_unknown_models_are_refused(platform, settings):
    b = settings.kafka_bootstrap
    async with platform(scheduler) as p:
        await send_event(b, JobRequestedV1(job_id=job_id_for("nobody", "k"), idempotency_key="k", model="m",
                                           training_file="ds-1"), "nobody", producer_token=await producer_token(p["scheduler"], "nobody"))
        await send_event(b, JobRequestedV1(job_id=job_id_for("demo", "k2"), idempotency_key="k2",
                                           model="no-such-model", training_file="ds-1"), "demo",
                         producer_token=await producer_token(p["scheduler"], "demo"))

        async def failures():
            got = {e["payload"]["code"] for e in await outbox(p["scheduler"], "job.failed")}
            return got if len(got) >= 2 else None
        assert await wait_until(failures, 30) == {"unknown_tenant", "unknown_base_model"}


async def test_idempotency_same_key_same_job_different_params_conflict(platform, settings, fake_model):
    async with platform(scheduler) as p:
        h, auth = {"Idempotency-Key": "same"}, IdentityAuth("demo")
        async with httpx.AsyncClient(base_url=p.url("scheduler")) as c:
            a = await c.post("/v1/fine_tuning/jobs", json={"model": fake_model, "training_file": "ds-1"}, headers=h, auth=auth)
            b = await c.post("/v1/fine_tuning/jobs", json={"model": fake_model, "training_file": "ds-1"}, headers=h, auth=auth)
            assert a.status_code == b.status_code == 200 and a.json()["id"] == b.json()["id"]
            c3 = await c.post("/v1/fine_tuning/jobs", json={"model": fake_model, "training_file": "ds-2"}, headers=h, auth=auth)
            assert c3.status_code == 409 and "different parameters" in c3.text
            bad = await c.post("/v1/fine_tuning/jobs", json={"model": fake_model, "training_file": "ds-1",
                                                             "hyperparameters": {"learning_rate": -1}},
                               auth=IdentityAuth("demo"), headers={"Idempotency-Key": "neg"})
            assert bad.status_code == 400 and "learning_rate" in bad.text
        assert await p["scheduler"].pool.fetchval("SELECT count(*) FROM jobs") == 1
