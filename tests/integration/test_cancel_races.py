"""Cancel wins every race. A cancel accepted in any state before `succeeded`
(validating_files, queued, provisioning, running, evaluating) leaves the job cancelled, registers
and serves no model of it, and usage closes it as cancelled with exactly the GPU-seconds its
segments ran. The six real services on the embedded stack, a tiny model that really trains.

The agent that hears of the cancel before the assignment (two topics, no order between them) is
driven on its own in `test_an_assignment_arriving_after_its_cancel_never_runs`."""

import asyncio
import json
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from whetstone.cli.dev import core_service_builders
from whetstone.cli.main import submit_dataset
from whetstone.contracts import JobAssignedV1, JobCancelledV1, TrainingSpec
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.modelkit.tiny import build_tiny_model
from whetstone.runtime.identity import IdentityAuth

pytestmark = pytest.mark.integration


def h() -> IdentityAuth:
    """The tenant's identity: each request signed as it is sent, with the test's internal secret."""
    return IdentityAuth("demo")


TINY = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 64, "lora_r": 4, "learning_rate": 2e-3,
        "checkpoint_every_steps": 2}


def rows(n: int) -> bytes:
    return b"".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                                             {"role": "assistant", "content": f"It is {i + 1}."}]}).encode() + b"\n"
                    for i in range(n))


async def job_state(c: httpx.AsyncClient, job_id: str) -> dict:
    return (await c.get(f"/v1/fine_tuning/jobs/{job_id}", auth=h())).json()


async def create(c: httpx.AsyncClient, training_file: str, key: str, **hp) -> dict:
    r = await c.post("/v1/fine_tuning/jobs", auth=h(), headers={"Idempotency-Key": key},
                     json={"model": "tiny-llama", "training_file": training_file, "method": "lora",
                           "hyperparameters": {**TINY, **hp}})
    assert r.status_code == 200, r.text
    return r.json()


async def reach(c: httpx.AsyncClient, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    async def check():
        job = await job_state(c, job_id)
        assert job["state"] not in ("succeeded", "failed", "cancelled") or job["state"] in states, job
        return job if job["state"] in states else None
    return await wait_until(check, timeout, f"{job_id} in {states}")


async def cancel(c: httpx.AsyncClient, job_id: str) -> dict:
    r = await c.post(f"/v1/fine_tuning/jobs/{job_id}/cancel", auth=h())
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    return r.json()


async def closed_usage(m: httpx.AsyncClient, job_id: str, timeout: float = 30) -> dict:
    """The job's usage, once closed as cancelled (metering's close grace is 120 s: a cancel must not
    need it; a total closed at the training's completion is corrected when the cancel comes)."""
    async def check():
        r = await m.get(f"/v1/usage/jobs/{job_id}", auth=h())
        last.append(r.json())
        return r.json() if r.status_code == 200 and (r.json().get("total") or {}).get("outcome") == "cancelled" \
            else None
    last: list = []
    try:
        usage = await wait_until(check, timeout, f"usage of {job_id} closed as cancelled")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last[-1]}") from None
    ran = sum((Decimal(str(x["gpu_seconds"])) for x in usage["lines"]), Decimal(0))
    assert Decimal(str(usage["total"]["gpu_seconds"])) == ran, usage   # exactly what its segments ran
    return usage


async def no_model(r: httpx.AsyncClient, job_id: str) -> None:
    models = (await r.get("/v1/models", params={"job_id": job_id}, auth=h())).json()["data"]
    assert all(m.get("stage") == "archived" for m in models), models


async def test_cancel_wins_in_every_state_before_succeeded(platform, settings, tmp_path):
    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    small.write_bytes(rows(24))
    large.write_bytes(rows(64))
    async with platform(*core_service_builders()) as p:
        s, m, r = (httpx.AsyncClient(base_url=p.url(x), timeout=30) for x in ("scheduler", "metering", "registry"))
        quick = await submit_dataset(settings, small, "demo")
        slow = await submit_dataset(settings, large, "demo", name="slow.jsonl")

        # validating_files: its training file never validated; closed at once with nothing billed
        v = await create(s, "ds-" + "0" * 24, "cancel-v")
        assert v["state"] == "validating_files"
        await cancel(s, v["id"])
        assert (await closed_usage(m, v["id"]))["total"]["gpu_seconds"] == 0

        # running: cancelled after its first steps; queued: waits behind it for the one CPU slot
        run = await create(s, slow, "cancel-r", n_epochs=20, batch_size=1)
        await wait_until(lambda: _progressed(s, run["id"]), 180, "first training steps")
        q = await create(s, quick, "cancel-q")
        assert (await reach(s, q["id"], ("queued",)))["state"] == "queued"
        await cancel(s, q["id"])
        assert (await closed_usage(m, q["id"]))["total"]["gpu_seconds"] == 0
        await cancel(s, run["id"])
        usage = await closed_usage(m, run["id"])
        assert Decimal(str(usage["total"]["gpu_seconds"])) > 0 and len(usage["lines"]) == 1

        # provisioning: cancelled as soon as the node has it (before or while its process starts)
        prov = await create(s, quick, "cancel-p")
        await reach(s, prov["id"], ("provisioning", "running"))
        await cancel(s, prov["id"])
        await closed_usage(m, prov["id"])

        # evaluating: training finished, the gate is running; the cancel is still accepted
        ev = await create(s, quick, "cancel-e")
        await reach(s, ev["id"], ("evaluating",), 240)
        await cancel(s, ev["id"])
        await closed_usage(m, ev["id"])
        # the gate's run for it ends without an answer (superseded), so no model is ever made of it
        async def eval_dropped():
            async with p["eval"].uow() as uow:
                status = await uow.conn.fetchval("SELECT status FROM eval_runs WHERE job_id = $1", ev["id"])
            return status in (None, "superseded") or None
        await wait_until(eval_dropped, 120, "the cancelled job's evaluation dropped")

        # nothing after the cancels: every job stays cancelled, no completion, checkpoint or model of them
        await asyncio.sleep(3)
        cancelled = [v["id"], q["id"], run["id"], prov["id"], ev["id"]]
        for job_id in cancelled:
            job = await job_state(s, job_id)
            assert job["status"] == "cancelled" and job["fine_tuned_model"] is None, job
            await no_model(r, job_id)
        completed = [e["payload"]["job_id"] for e in await outbox(p["trainer-agent"], "job.completed")]
        assert not set(completed) & {q["id"], run["id"], prov["id"]}, completed
        finals = [e["payload"]["job_id"] for e in await outbox(p["trainer-agent"], "checkpoint.written")
                  if e["payload"]["kind"] == "final"]
        assert not set(finals) & {q["id"], run["id"], prov["id"]}, finals
        assert not [e for e in await outbox(p["registry"], "model.registered")
                    if e["payload"]["lineage"]["job_id"] in cancelled]
        for c in (s, m, r):
            await c.aclose()


async def _progressed(s: httpx.AsyncClient, job_id: str) -> bool | None:
    job = await job_state(s, job_id)
    assert job["state"] not in ("succeeded", "failed", "cancelled"), job
    return job["state"] == "running" and (job.get("progress") or {}).get("step", 0) >= 1 or None


async def test_an_assignment_arriving_after_its_cancel_never_runs(platform, settings):
    """job.cancelled and job.assigned travel on different topics: a node may hear the cancel first.
    The cancel is remembered (nothing of the job ran here yet), so the assignment arriving after it is
    recorded as cancelled and never claimed."""
    from whetstone.trainer_agent.bootstrap import build_service as trainer_svc

    async with platform(trainer_svc) as p:
        agent = p["trainer-agent"]
        node = agent.ctx.config.node_id
        spec = TrainingSpec(base_model="tiny-llama", base_model_sha256="0" * 64, dataset_id="ds-1", dataset_version="v",
                            train_uri="s3://whetstone/tenants/demo/datasets/ds-1/train.jsonl", method="lora",
                            hyperparameters={}, hyperparameters_hash="h")
        env = await send_event(settings.kafka_bootstrap, JobCancelledV1(job_id="ftjob-late", node_id=node), "demo")

        async def handled():
            async with agent.uow() as uow:
                return await uow.conn.fetchval("SELECT 1 FROM inbox WHERE topic = 'job.cancelled' AND message_id = $1",
                                               str(env.event_id))
        await wait_until(handled, 30, "the cancel handled")
        await send_event(settings.kafka_bootstrap, JobAssignedV1(job_id="ftjob-late", node_id=node,
                                                                 segment_id="ftjob-late-s1", attempt=1, gpu_ids=[0],
                                                                 spec=spec), "demo")

        async def recorded():
            async with agent.uow() as uow:
                return await uow.conn.fetchval("SELECT status FROM runs WHERE segment_id = 'ftjob-late-s1'")
        assert await wait_until(recorded, 30, "the assignment recorded") == "cancelled"
        await asyncio.sleep(2.5)   # two supervisor rounds: it is never claimed
        assert await recorded() == "cancelled" and not agent.ctx.node.segments
        for topic in ("job.started", "job.completed"):
            assert not [e for e in await outbox(agent, topic) if e["payload"]["job_id"] == "ftjob-late"], topic
        # one report that the attempt never started (no segment), so metering closes the usage at once
        [failed] = [e["payload"] for e in await outbox(agent, "job.failed") if e["payload"]["job_id"] == "ftjob-late"]
        assert failed["code"] == "cancelled" and failed["segment_id"] is None and failed["attempt"] == 1, failed
