"""The scheduler service on the real embedded stack: admission, quotas, queue view, placement on the
CPU node and on GPU gangs, preemption, lost nodes, tenant isolation, Kubernetes inventory."""

import asyncio
import time
from datetime import UTC, datetime

import httpx
import pytest

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, DatasetValidatedV1, JobCompletedV1, JobFailedV1, JobPreemptedV1,
    JobRequestedV1, JobStartedV1, NodeHeartbeatV1, ResourceRequest, UsageMeteredV1, job_id_for,
)
from whetstone.devstack.testing import outbox, producer_token, send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import QuotaSettings, SchedulerSettings

pytestmark = pytest.mark.integration


def scheduler(**settings):
    return lambda: build_service(SchedulerSettings(**settings))


async def heartbeat(settings, node_id, gpu_type="cpu", gpus=1, spot=False, group="local", memory=0.0, address=None):
    await send_event(settings.kafka_bootstrap, NodeHeartbeatV1(
        node_id=node_id, gpu_type=gpu_type, gpu_count=gpus, gpu_memory_gb=memory, free_gpu_ids=list(range(gpus)),
        spot=spot, interconnect_group=group, sent_at=datetime.now(UTC), address=address), "platform")


async def validated(settings, tenant, dataset_id="ds-1", tokens=5000):
    await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
        dataset_id=dataset_id, version="cd" * 32, name="d.jsonl", status="accepted", rows_total=200, rows_kept=200,
        tokens_total=tokens, train_uri=f"s3://whetstone/tenants/{tenant}/datasets/{dataset_id}/train.jsonl"), tenant)


async def node_and_dataset(settings, rt, node_id="n1", tenant="demo"):
    """A live CPU node and an accepted dataset the scheduler has recorded: ready to place a job."""
    await heartbeat(settings, node_id)
    await validated(settings, tenant)
    await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")


async def post(c, tenant, key, trace_id=None, **body):
    body = {"model": "tiny-llama", "training_file": "ds-1", **body}
    headers = {"Idempotency-Key": key} | ({"X-Trace-Id": trace_id} if trace_id else {})
    return await c.post("/v1/fine_tuning/jobs", json=body, headers=headers, auth=IdentityAuth(tenant))


async def get(c, tenant, job_id):
    return (await c.get(f"/v1/fine_tuning/jobs/{job_id}", auth=IdentityAuth(tenant))).json()


async def status_is(c, tenant, job_id, state):
    """The platform's own state (`status` is OpenAI's coarser one)."""
    return (await get(c, tenant, job_id))["state"] == state


async def assigned(rt, job_id, n=1):
    """The job.assigned envelopes for ``job_id`` once there are at least ``n``."""
    async def check():
        found = [e["payload"] for e in await outbox(rt, "job.assigned") if e["payload"]["job_id"] == job_id]
        return found if len(found) >= n else None
    return await wait_until(check, 30, f"{n} job.assigned for {job_id}")


async def test_tiny_job_on_the_cpu_node_queue_view_cancel_isolation_idempotency(platform, settings, tiny_model):
    async with platform(scheduler(node_timeout_s=300)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        await heartbeat(settings, "cpu-1")
        await validated(settings, "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")
        bad_trace = await post(c, "demo", "a", trace_id="no spaces allowed")
        assert bad_trace.status_code == 400 and bad_trace.json()["error"]["code"] == "invalid_trace_id"
        r = await post(c, "demo", "a", trace_id="caller-trace-42")
        assert r.status_code == 200, r.text
        a = r.json()
        assert a["resources"]["shapes"][0] == {"gpu_type": "cpu", "gpus_per_node": 1, "nodes": 1}
        assert a["trace_id"] == "caller-trace-42"
        (first,) = await assigned(rt, a["id"])
        assert first["node_id"] == "cpu-1" and first["gpu_ids"] == [0]
        # the caller's trace id is on every event the scheduler publishes about the job
        about_a = [e for t in ("job.queued", "job.assigned") for e in await outbox(rt, t)
                   if e["payload"]["job_id"] == a["id"]]
        assert len(about_a) == 2 and {e["trace_id"] for e in about_a} == {"caller-trace-42"}

        # the CPU node is busy: the next job waits, with its position and an estimated start
        b = (await post(c, "demo", "b")).json()
        assert b["status"] == "queued" and b["queue_position"] == 1
        # the estimated start comes from the scheduling loop's forecast, moments after the create
        b = await wait_until(lambda: _with_start(c, b["id"]), 30, "estimated start")
        assert b["queue_position"] == 1 and time.time() - 5 <= b["estimated_start_at"] <= time.time() + 120
        events = (await c.get(f"/v1/fine_tuning/jobs/{a['id']}/events", auth=IdentityAuth("demo"))).json()
        assert any("assigned to cpu-1" in e["message"] for e in events["data"])

        # Stripe idempotency: same key same job; same key, other parameters: an error that says so
        again = await post(c, "demo", "a")
        assert again.status_code == 200 and again.json()["id"] == a["id"]
        clash = await post(c, "demo", "a", hyperparameters={"n_epochs": 7})
        assert clash.status_code == 409 and "different parameters" in clash.json()["error"]["message"]

        # tenants see only their own jobs
        assert (await c.get(f"/v1/fine_tuning/jobs/{a['id']}", auth=IdentityAuth("acme"))).status_code == 404
        assert (await c.get("/v1/fine_tuning/jobs", auth=IdentityAuth("acme"))).json()["data"] == []
        page1 = (await c.get("/v1/fine_tuning/jobs", params={"limit": 1}, auth=IdentityAuth("demo"))).json()
        page2 = (await c.get("/v1/fine_tuning/jobs", params={"limit": 1, "after": page1["last_id"]},
                             auth=IdentityAuth("demo"))).json()
        assert page1["has_more"] and not page2["has_more"]
        assert {page1["data"][0]["id"], page2["data"][0]["id"]} == {a["id"], b["id"]}
        other = await c.post(f"/v1/fine_tuning/jobs/{b['id']}/cancel", auth=IdentityAuth("acme"))
        assert other.status_code == 404

        cancelled = await c.post(f"/v1/fine_tuning/jobs/{b['id']}/cancel", auth=IdentityAuth("demo"))
        assert cancelled.json()["status"] == "cancelled"
        assert (await c.post(f"/v1/fine_tuning/jobs/{b['id']}/cancel",
                             auth=IdentityAuth("demo"))).status_code == 409

        # a failed job (user error) is never re-queued, even with its node free
        await send_event(settings.kafka_bootstrap, JobFailedV1(
            job_id=a["id"], segment_id=first["segment_id"], node_id="cpu-1", error_class="user", code="nan_loss",
            message="loss became NaN at step 3"), "demo")
        await wait_until(lambda: status_is(c, "demo", a["id"], "failed"), 30, "failed")
        after = rt.ctx.loop.cycles + 2   # a whole scheduling cycle ran after the failure was committed

        async def cycled() -> bool:
            rt.ctx.loop.wake()
            return rt.ctx.loop.cycles >= after
        await wait_until(cycled, 30, "two scheduling cycles after the failure")
        assert len(await assigned(rt, a["id"])) == 1 and await status_is(c, "demo", a["id"], "failed")


async def test_bad_input_is_rejected_at_admission_and_gangs_stay_in_one_group(platform, settings, tiny_model,
                                                                              big_model):
    async with platform(scheduler(unknown_dataset_grace_s=1.0, unplaceable_grace_s=1.0, node_timeout_s=300)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        # admitted while no node is known yet; once the pool turns out to be one CPU node, it fails
        await validated(settings, "acme")
        early = await c.post("/v1/fine_tuning/jobs", auth=IdentityAuth("acme"), headers={"Idempotency-Key": "early"},
                             json={"model": big_model, "training_file": "ds-1"})
        assert early.status_code == 200, early.text
        await wait_until(lambda: status_is(c, "acme", early.json()["id"], "queued"), 30, "queued")
        await heartbeat(settings, "cpu-1")
        await wait_until(lambda: status_is(c, "acme", early.json()["id"], "failed"), 30, "unplaceable failure")
        assert (await get(c, "acme", early.json()["id"]))["error"]["code"] == "larger_than_pool"

        async def refused(status, code, **body):
            r = await post(c, "demo", f"bad-{code}-{len(body)}", **body)
            assert r.status_code == status, r.text
            return r.json()["error"]

        assert "no-such-model" in (await refused(400, "unknown_base_model", model="no-such-model"))["message"]
        assert "'standard'" in (await refused(403, "tier_not_allowed", tier="premium"))["message"]
        lowered = await refused(400, "floor", eval_config={"stages": {"safety": {"refusal_floor": 0.1}}})
        assert lowered["code"] == "eval_config_out_of_bounds"
        assert lowered["param"] == "eval_config.stages.safety.refusal_floor", lowered
        r = await post(c, "demo", "bad-lr", hyperparameters={"learning_rate": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "hyperparameters.learning_rate"
        assert "only apply to adapter methods" in (await refused(400, "hp", method="full",
                                                                 hyperparameters={"lora_r": 8}))["message"]
        assert "context length" in (await refused(400, "ctx", hyperparameters={"max_seq_len": 4096}))["message"]
        too_big = await refused(400, "larger_than_pool", model=big_model)
        assert too_big["code"] == "larger_than_pool" and "GB" in too_big["message"] and "cpu" in too_big["message"]
        explicit = await refused(400, "explicit", model=big_model,
                                 resources={"gpu_type": "cpu", "gpus_per_node": 1, "nodes": 1})
        assert explicit["code"] == "resources_insufficient"

        # the same checks on the Kafka entry point answer with job.failed
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=job_id_for("demo", "kafka-1"), idempotency_key="kafka-1", model="no-such-model",
            training_file="ds-1"), "demo", producer_token=await producer_token(rt, "demo"))
        async def kafka_failure():
            return [e["payload"] for e in await outbox(rt, "job.failed")
                    if e["payload"]["job_id"] == job_id_for("demo", "kafka-1")]
        failed = await wait_until(kafka_failure, 30, "job.failed")
        assert failed[0]["code"] == "unknown_base_model"
        # an explicit resource request travels on Kafka too
        await send_event(settings.kafka_bootstrap, JobRequestedV1(
            job_id=job_id_for("demo", "kafka-2"), idempotency_key="kafka-2", model=big_model, training_file="ds-1",
            resources=ResourceRequest(gpu_type="cpu", gpus_per_node=1)), "demo", producer_token=await producer_token(rt, "demo"))

        async def kafka_failure_2():
            return [e["payload"] for e in await outbox(rt, "job.failed")
                    if e["payload"]["job_id"] == job_id_for("demo", "kafka-2")]
        assert (await wait_until(kafka_failure_2, 30, "job.failed"))[0]["code"] == "resources_insufficient"

        # a training file nobody uploaded fails fast instead of waiting in validating_files
        ghost = (await post(c, "demo", "ghost", training_file="ds-never-uploaded")).json()
        assert ghost["status"] == "validating_files"
        await wait_until(lambda: status_is(c, "demo", ghost["id"], "failed"), 30, "unknown dataset failure")
        assert (await get(c, "demo", ghost["id"]))["error"]["code"] == "unknown_training_file"

        # gang: 2 nodes x 8 GPUs only inside one interconnect group
        for node, group, address in (("a1", "ib-a", None), ("b1", "ib-b", "10.1.0.1"), ("b2", "ib-b", None)):
            await heartbeat(settings, node, "NVIDIA-A100-SXM4-80GB", 8, group=group, memory=80, address=address)
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 4 FROM nodes"), 30, "nodes")
        gang = await c.post("/v1/fine_tuning/jobs", auth=IdentityAuth("acme"), headers={"Idempotency-Key": "gang"}, json={
            "model": tiny_model, "training_file": "ds-1", "resources": {"gpu_type": "A100", "gpus_per_node": 8,
                                                                         "nodes": 2}})
        assert gang.status_code == 200, gang.text
        parts = await assigned(rt, gang.json()["id"], 2)
        assert sorted(x["node_id"] for x in parts) == ["b1", "b2"]
        assert len({x["segment_id"] for x in parts}) == 1 and all(x["gpu_ids"] == list(range(8)) for x in parts)
        # every member learns where to meet: the same master and hosts, its own rank
        meets = sorted((x["rendezvous"] for x in parts), key=lambda r: r["node_rank"])
        assert [r["node_rank"] for r in meets] == [0, 1] and all(r["nodes"] == 2 for r in meets)
        hosts = {"b1": "10.1.0.1", "b2": "b2"}  # b2 reported no address: reached by its node id
        ranked = [hosts[x["node_id"]] for x in sorted(parts, key=lambda x: x["rendezvous"]["node_rank"])]
        assert all(r["hosts"] == ranked and r["master_addr"] == ranked[0] for r in meets)


async def test_concurrent_submissions_never_over_admit_and_quotas_come_from_usage_events(platform, settings,
                                                                                         tiny_model):
    quotas = {"demo": QuotaSettings(max_in_flight=5), "hobbyist": QuotaSettings(hard_gpu_hours=1.0),
              "acme": QuotaSettings(soft_gpu_hours=0.001)}
    async with platform(scheduler(tenant_quotas=quotas)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=120) as c:
        rt = p["scheduler"]
        answers = await asyncio.gather(*(post(c, "demo", f"burst-{i}") for i in range(200)))
        codes = [r.status_code for r in answers]
        assert codes.count(200) == 5 and codes.count(429) == 195, sorted(set(codes))
        assert all(r.json()["error"]["code"] == "concurrency_quota_exceeded" for r in answers if r.status_code == 429)
        assert await rt.pool.fetchval("SELECT count(*) FROM jobs WHERE tenant_id = 'demo'") == 5

        # hard cap: usage arrives as usage.metered events only
        assert (await post(c, "hobbyist", "before")).status_code == 200
        await send_event(settings.kafka_bootstrap, UsageMeteredV1(
            job_id="old", scope="job", gpu_seconds=3700, billable_gpu_seconds=3700, charge_class="charged",
            price_version="v", cost=1.0), "hobbyist")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM tenant_usage"), 30, "usage")
        over = await post(c, "hobbyist", "after")
        assert over.status_code == 429 and over.json()["error"]["code"] == "hard_quota_exceeded"

        # soft quota: admitted, flagged, and the tenant is told
        await heartbeat(settings, "cpu-1")
        await validated(settings, "acme")
        soft = (await post(c, "acme", "soft")).json()
        await wait_until(lambda: rt.pool.fetchval("SELECT quota IS NOT NULL FROM jobs WHERE job_id = $1",
                                                  soft["id"]), 30, "queued")
        view = await get(c, "acme", soft["id"])
        assert view["quota"]["over_soft_quota"] is True
        events = (await c.get(f"/v1/fine_tuning/jobs/{soft['id']}/events", auth=IdentityAuth("acme"))).json()
        assert any(e["level"] == "warning" and "soft" in e["message"] for e in events["data"])


async def test_premium_preempts_the_free_job_which_resumes_from_its_checkpoint(platform, settings, tiny_model,
                                                                                big_model):
    async with platform(scheduler(node_timeout_s=300)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        b = settings.kafka_bootstrap
        await heartbeat(settings, "gpu-1", "A100", 8, memory=80)
        await validated(settings, "hobbyist", tokens=1_000_000)     # ~16 min of 70B LoRA on 8 A100s
        await validated(settings, "acme")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 2 FROM datasets"), 30, "datasets")
        whole_node = {"gpu_type": "A100", "gpus_per_node": 8, "nodes": 1}
        free = (await c.post("/v1/fine_tuning/jobs", auth=IdentityAuth("hobbyist"), headers={"Idempotency-Key": "f"},
                             json={"model": big_model, "training_file": "ds-1", "resources": whole_node})).json()
        (seg1,) = await assigned(rt, free["id"])
        await send_event(b, JobStartedV1(job_id=free["id"], node_id="gpu-1", segment_id=seg1["segment_id"], attempt=1,
                                         gpu_type="A100", gpu_count=8, started_at=datetime.now(UTC)), "hobbyist")
        ck = CheckpointRef(uri="s3://whetstone/tenants/hobbyist/jobs/x/checkpoints/step-12", step=12,
                           manifest_sha256="0" * 64)
        await send_event(b, CheckpointWrittenV1(
            job_id=free["id"], segment_id=seg1["segment_id"], checkpoint_id="c12", kind="periodic", step=12,
            uri=ck.uri, manifest_sha256=ck.manifest_sha256, files=3, size_bytes=10, written_at=datetime.now(UTC)),
            "hobbyist")
        await wait_until(lambda: status_is(c, "hobbyist", free["id"], "running"), 30, "running")

        prem = (await c.post("/v1/fine_tuning/jobs", auth=IdentityAuth("acme"), headers={"Idempotency-Key": "p"},
                             json={"model": tiny_model, "training_file": "ds-1", "resources": whole_node})).json()
        victim = await wait_until(lambda: _preemption(c, free["id"]), 30, "preemption request")
        assert victim["reason"] == "priority" and victim["for_job"] == prem["id"]

        # the agent checkpoints and stops: the victim is re-queued, the premium job gets the node
        await send_event(b, JobPreemptedV1(job_id=free["id"], segment_id=seg1["segment_id"], node_id="gpu-1",
                                           reason="priority", stopped_at=datetime.now(UTC), checkpoint=ck), "hobbyist")
        (pseg,) = await assigned(rt, prem["id"])
        assert pseg["node_id"] == "gpu-1"
        view = await get(c, "hobbyist", free["id"])
        assert view["status"] == "queued" and view["preemptions"]["priority"] == 1
        assert view["latest_checkpoint"]["step"] == 12

        await send_event(b, JobCompletedV1(job_id=prem["id"], segment_id=pseg["segment_id"], node_id="gpu-1",
                                           stopped_at=datetime.now(UTC), steps=5, final_checkpoint=ck), "acme")
        seg2 = (await assigned(rt, free["id"], 2))[1]
        assert seg2["attempt"] == 2 and seg2["resume_from"]["step"] == 12 and seg2["job_id"] == free["id"]

        # one trace for the job's whole life, although other jobs' events triggered half of these
        about_free = [e for t in ("job.queued", "job.assigned", "job.preempt_requested")
                      for e in await outbox(rt, t) if e["payload"]["job_id"] == free["id"]]
        assert len(about_free) == 5 and len({e["trace_id"] for e in about_free}) == 1


async def _with_start(c, job_id):
    view = await get(c, "demo", job_id)
    return view if view["estimated_start_at"] is not None else None


async def _preemption(c, job_id):
    return (await get(c, "hobbyist", job_id))["preemption_requested"]


async def test_lost_heartbeats_requeue_the_job_from_its_checkpoint(platform, settings, tiny_model):
    async with platform(scheduler(node_timeout_s=3.0, lost_node_check_s=0.5)) as p, \
            httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        await node_and_dataset(settings, rt)
        job = (await post(c, "demo", "lost")).json()
        (seg1,) = await assigned(rt, job["id"])
        assert seg1["node_id"] == "n1"
        await send_event(settings.kafka_bootstrap, CheckpointWrittenV1(
            job_id=job["id"], segment_id=seg1["segment_id"], checkpoint_id="c5", kind="periodic", step=5,
            uri="s3://whetstone/x/step-5", manifest_sha256="1" * 64, files=1, size_bytes=1,
            written_at=datetime.now(UTC)), "demo")

        async def keep_n2_alive():
            while True:
                await heartbeat(settings, "n2")
                await asyncio.sleep(0.7)
        beats = asyncio.create_task(keep_n2_alive())
        try:
            seg2 = (await assigned(rt, job["id"], 2))[1]
        finally:
            beats.cancel()
        assert seg2["node_id"] == "n2" and seg2["attempt"] == 2 and seg2["resume_from"]["step"] == 5
        assert await rt.pool.fetchval("SELECT lost FROM nodes WHERE node_id = 'n1'")
        preempted = [e["payload"] for e in await outbox(rt, "job.preempted")]
        assert [x["reason"] for x in preempted] == ["node_lost"]


async def test_kubernetes_inventory_places_and_preempts_before_a_spot_node_disappears(platform, settings,
                                                                                     tiny_model, kube_api):
    builder = scheduler(k8s_inventory=True, k8s_host=kube_api.url, node_timeout_s=600)
    async with platform(builder) as p, httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c:
        rt = p["scheduler"]
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 5 FROM nodes"), 30, "k8s inventory")
        assert not await rt.pool.fetchval("SELECT schedulable FROM nodes WHERE node_id = 'ip-10-0-3-21.ec2.internal'")
        await validated(settings, "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")
        job = (await post(c, "demo", "k8s", resources={"gpu_type": "A100", "gpus_per_node": 8})).json()
        (seg1,) = await assigned(rt, job["id"])
        assert seg1["node_id"] == "ip-10-0-1-12.ec2.internal"       # standard tier: spot first

        kube_api.release.set()                                      # taint spot-itn, uncordon, then delete
        requested = await wait_until(lambda: _preemption_of(c, job["id"]), 30, "preemption on spot notice")
        assert requested["reason"] == "spot_loss"
        seg2 = (await assigned(rt, job["id"], 2))[1]
        assert seg2["node_id"] == "ip-10-0-1-11.ec2.internal" and seg2["attempt"] == 2
        view = await get(c, "demo", job["id"])
        assert view["preemptions"]["spot"] == 1
        assert await rt.pool.fetchval("SELECT schedulable FROM nodes WHERE node_id = 'ip-10-0-3-21.ec2.internal'")


async def _preemption_of(c, job_id):
    events = (await c.get(f"/v1/fine_tuning/jobs/{job_id}/events", auth=IdentityAuth("demo"))).json()["data"]
    return next((e["data"] for e in events if e["data"].get("reason") == "spot_loss"), None)
