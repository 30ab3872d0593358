"""Pause and resume (issue 36 point 7) through the public port with the official `openai` client,
on the six real services and a tiny model that really trains on the one CPU slot.

A running job is paused: its node writes an emergency checkpoint and gives the slot back (the job
queued behind it is assigned), the job is parked as `paused` (not re-queued, no refund, no failure).
Resumed, it goes through the queue again and finishes `succeeded`, training on from the emergency
checkpoint with no step repeated or skipped; its usage is one job whose GPU-seconds are its two
segments', each billed once. A queued job paused leaves the queue, and cancelling it then closes its
usage as cancelled. Pausing an ended job, resuming a job that is not paused: 409 naming the status.
Another tenant: 404. A key without the write scope: 403."""

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest

from whetstone.cli.dev import core_service_builders, upstreams_of
from whetstone.cli.keys import create_key
from whetstone.devstack.testing import outbox, until
from whetstone.modelkit.tiny import build_tiny_model

pytestmark = pytest.mark.integration
TINY = {"n_epochs": 1, "batch_size": 1, "max_seq_len": 64, "lora_r": 4, "learning_rate_multiplier": 2}
# the gate is not what is tested here: every stage off (the test's tier may switch safety off), so a job's
# evaluation takes seconds, not minutes
NO_GATE = {"stages": {"benchmarks": False, "holdout": False, "safety": False, "judge": False}}


def rows(n: int) -> bytes:
    return b"".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                                             {"role": "assistant", "content": f"It is {i + 1}."}]}).encode() + b"\n"
                    for i in range(n))


def state(job: openai.types.fine_tuning.FineTuningJob) -> str:
    return str(job.model_extra["state"])


async def create(client: openai.AsyncOpenAI, file_id: str, **hp) -> openai.types.fine_tuning.FineTuningJob:
    return await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=file_id,
        method={"type": "supervised", "supervised": {"hyperparameters": {**TINY, **hp}}},
        extra_body={"eval_config": NO_GATE})


async def reach(client: openai.AsyncOpenAI, job_id: str, states: tuple[str, ...], timeout: float = 180):
    def done(job) -> bool:
        assert state(job) not in ("succeeded", "failed", "cancelled") or state(job) in states, job
        return state(job) in states
    return await until(lambda: client.fine_tuning.jobs.retrieve(job_id), done, timeout, f"{job_id} in {states}")


async def usage(client: openai.AsyncOpenAI, job_id: str, outcome: str, timeout: float = 60) -> dict:
    async def fetch() -> dict:
        return await client.get(f"/usage/jobs/{job_id}", cast_to=httpx.Response)
    response = await until(fetch, lambda r: r.status_code == 200 and (r.json().get("total") or {}).get("outcome")
                           == outcome, timeout, f"usage of {job_id} closed as {outcome}")
    return response.json()


async def test_pause_checkpoints_frees_the_slot_and_resume_finishes_where_it_stopped(platform, settings,
                                                                                     openai_clients, monkeypatch):
    monkeypatch.setenv("WHETSTONE_EVAL_TIERS_MAY_SKIP_SAFETY", '["standard"]')   # demo's tier
    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    async with platform(*core_service_builders()) as p:
        upstreams = upstreams_of(p.runtimes.values())
        async with openai_clients(upstreams) as (client, other):
            training = await client.files.create(file=("train.jsonl", rows(26)), purpose="fine-tune")
            await until(lambda: client.files.retrieve(training.id), lambda f: f.status != "uploaded", 120,
                        "validation")
            # the first job gets the one slot; two more wait behind it
            # four epochs (104 steps, tens of seconds on a loaded machine): the pause lands while it trains
            long = await create(client, training.id, checkpoint_every_steps=1000, n_epochs=4)
            behind = await create(client, training.id)
            waiting = await create(client, training.id)

            # the running job, paused as soon as training began (job.started is sent once the trainer is set
            # up, so the node stops after a finished step, well before the end): `paused` at once, parked
            # once its node wrote the emergency checkpoint
            await reach(client, long.id, ("running",), 240)
            answer = await client.fine_tuning.jobs.pause(long.id)
            assert answer.status == "paused", answer
            again = await client.fine_tuning.jobs.pause(long.id)   # a pause in flight: the same answer
            assert again.status == "paused" and again.id == long.id
            # a queued job paused leaves the queue
            await reach(client, waiting.id, ("queued",))
            paused_in_queue = await client.fine_tuning.jobs.pause(waiting.id)
            assert paused_in_queue.status == "paused" and state(paused_in_queue) == "paused", paused_in_queue

            parked = await reach(client, long.id, ("paused",), 120)
            assert parked.status == "paused" and parked.finished_at is None and parked.error is None
            assert parked.model_extra["node_id"] is None and parked.model_extra["placement"] == []
            checkpoint = parked.model_extra["latest_checkpoint"]
            assert checkpoint["kind"] == "emergency" and checkpoint["step"] >= 1, checkpoint
            listed = (await client.fine_tuning.jobs.checkpoints.list(long.id)).data
            assert [c.step_number for c in listed if c.model_extra["kind"] == "emergency"] == [checkpoint["step"]]
            # the slot is free: the job queued behind it is assigned while it stays paused
            await reach(client, behind.id, ("provisioning", "running", "evaluating", "succeeded"))
            assert (await client.fine_tuning.jobs.retrieve(long.id)).status == "paused"
            await client.fine_tuning.jobs.cancel(behind.id)

            # resuming is only for a paused job; pausing only for a queued or running one
            with pytest.raises(openai.ConflictError) as refused:
                await client.fine_tuning.jobs.resume(behind.id)
            assert refused.value.code == "not_resumable" and "is cancelled, not paused" in refused.value.message

            # another tenant's key: 404; a key that may only read: 403
            for call in (other.fine_tuning.jobs.pause, other.fine_tuning.jobs.resume):
                with pytest.raises(openai.NotFoundError):
                    await call(long.id)
            read_only = (await asyncio.to_thread(create_key, "demo", scopes=["read"],
                                                 base_url=upstreams["scheduler"]))["key"]
            reader = openai.AsyncOpenAI(base_url=str(client.base_url), api_key=read_only, max_retries=0)
            for call in (reader.fine_tuning.jobs.pause, reader.fine_tuning.jobs.resume):
                with pytest.raises(openai.PermissionDeniedError):
                    await call(long.id)

            resumed = await client.fine_tuning.jobs.resume(long.id)
            assert resumed.status in ("queued", "running") and state(resumed) != "paused", resumed
            events = [e.message async for e in client.fine_tuning.jobs.list_events(long.id, limit=100)]
            assert any(m.startswith("Job paused") for m in events) and any(m.startswith("Job resumed") for m in events)

            # the paused queued job is cancelled: its usage closes as cancelled with nothing billed
            assert (await client.fine_tuning.jobs.cancel(waiting.id)).status == "cancelled"
            assert (await usage(client, waiting.id, "cancelled"))["total"]["gpu_seconds"] == 0

            done = await until(lambda: client.fine_tuning.jobs.retrieve(long.id),
                               lambda j: j.status in ("succeeded", "failed", "cancelled"), 420, "the resumed job")
            assert done.status == "succeeded", done
            with pytest.raises(openai.ConflictError) as ended:
                await client.fine_tuning.jobs.pause(long.id)
            assert ended.value.code == "not_pausable" and "is succeeded" in ended.value.message

            # trained on from the emergency checkpoint: every step once, none repeated or skipped
            sent = {t: [e["payload"] for e in await outbox(p["trainer-agent"], t) if e["payload"]["job_id"] == long.id]
                    for t in ("job.started", "job.progress", "job.completed")}
            first, second = sent["job.started"]
            assert second["resumed_from_step"] == checkpoint["step"] and second["attempt"] == 2
            [completed] = sent["job.completed"]
            steps = {seg: [e["step"] for e in sent["job.progress"] if e["segment_id"] == seg]
                     for seg in (first["segment_id"], second["segment_id"])}
            # (the agent reports a segment's first steps and its last, and every k-th between: a sample)
            before, after = steps[first["segment_id"]], steps[second["segment_id"]]
            assert before[0] == 1 and max(before) <= checkpoint["step"], steps
            assert after[0] == checkpoint["step"] + 1 and after[-1] == completed["steps"], steps
            assert after == sorted(set(after)), steps
            assert completed["steps"] == first["total_steps"] == second["total_steps"] > checkpoint["step"]

            # one job, its two segments each billed once (the paused one in full: the tenant's own stop)
            bill = await usage(client, long.id, "succeeded")
            segments = [x for x in bill["lines"] if x["scope"] == "segment"]
            assert len(segments) == 2 and len({x["segment_id"] for x in segments}) == 2, bill
            assert [x["basis"].startswith("paused by the tenant") for x in segments].count(True) == 1, segments
            assert bill["total"]["segments"] == 2
            assert bill["total"]["gpu_seconds"] == pytest.approx(sum(x["gpu_seconds"] for x in segments))
            assert all(x["billable_gpu_seconds"] == x["gpu_seconds"] for x in segments), segments
