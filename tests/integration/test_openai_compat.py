"""The official `openai` client, unchanged, against the platform's public port (issue 15, item 8):
files, SFT and DPO jobs in OpenAI's formats, retrieve until done, pagination, events, checkpoints,
cancel, an idempotent retry, and another tenant's key getting 404 on every object."""

import asyncio
import json
from pathlib import Path

import openai
import pytest

from whetstone.cli.dev import core_service_builders, upstreams_of
from whetstone.devstack.testing import until

pytestmark = pytest.mark.integration
TERMINAL = ("succeeded", "failed", "cancelled")
FAST = {"n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 2, "max_seq_len": 128,
        "checkpoint_every_steps": 2, "lora_r": 4}


def sft_file() -> bytes:
    rows = [{"messages": [{"role": "system", "content": "You add numbers."},
                          {"role": "user", "content": f"What is {i} + {i + 1}?"},
                          {"role": "assistant", "content": "Let me think.", "weight": 0},
                          {"role": "user", "content": "And?"},
                          {"role": "assistant", "content": f"{i} + {i + 1} = {2 * i + 1}.", "weight": 1}]}
            for i in range(24)]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def dpo_file() -> bytes:
    rows = [{"input": {"messages": [{"role": "user", "content": f"Say something kind about #{i}."}]},
             "preferred_output": [{"role": "assistant", "content": f"Number {i} is doing great work."}],
             "non_preferred_output": [{"role": "assistant", "content": "No."}]} for i in range(24)]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


async def test_official_openai_client_end_to_end(platform, settings, openai_clients):
    from whetstone.modelkit.tiny import build_tiny_model

    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    async with platform(*core_service_builders()) as p:
        async with openai_clients(upstreams_of(p.runtimes.values())) as (client, other):
            await run_compat(client, other)


async def run_compat(client: openai.AsyncOpenAI, other: openai.AsyncOpenAI) -> None:
    # -- files: upload both formats; retrieve until validated
    sft = await client.files.create(file=("train.jsonl", sft_file()), purpose="fine-tune")
    dpo = await client.files.create(file=("prefs.jsonl", dpo_file()), purpose="fine-tune")
    assert sft.object == "file" and sft.purpose == "fine-tune" and sft.bytes == len(sft_file())
    for f in (sft, dpo):
        f = await until(lambda f=f: client.files.retrieve(f.id), lambda x: x.status != "uploaded", 120,
                        f"validation of {f.id}")
        assert f.status == "processed", f
    assert (await client.files.content(sft.id)).content == sft_file()
    listed = [f.id async for f in client.files.list(limit=1)]  # auto-pagination must end
    assert sorted(listed) == sorted([sft.id, dpo.id])

    # -- jobs: SFT and DPO in OpenAI's method shape; an idempotent retry returns the same job
    sft_job = await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=sft.id, suffix="compat", seed=7,
        method={"type": "supervised", "supervised": {"hyperparameters": FAST}},
        extra_headers={"Idempotency-Key": "compat-sft-1"})
    again = await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=sft.id, suffix="compat", seed=7,
        method={"type": "supervised", "supervised": {"hyperparameters": FAST}},
        extra_headers={"Idempotency-Key": "compat-sft-1"})
    assert again.id == sft_job.id
    dpo_job = await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=dpo.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {**FAST, "beta": 0.1}}})
    assert dpo_job.method.type == "dpo" and sft_job.method.type == "supervised"
    assert sft_job.status in ("validating_files", "queued", "running") and sft_job.seed == 7
    # without an Idempotency-Key every call is a new job; this one is cancelled at once
    doomed = await client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=sft.id, method={"type": "supervised"})
    assert doomed.id not in (sft_job.id, dpo_job.id)
    cancelled = await client.fine_tuning.jobs.cancel(doomed.id)
    assert cancelled.status in ("cancelled",) or cancelled.status not in ("succeeded", "failed"), cancelled
    cancelled = await until(lambda: client.fine_tuning.jobs.retrieve(doomed.id), lambda j: j.status in TERMINAL,
                            60, "cancel")
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.ConflictError):  # a terminal job cannot be cancelled; no client retry loop
        await client.fine_tuning.jobs.cancel(doomed.id)

    # -- retrieve until done
    done = {}
    for job in (sft_job, dpo_job):
        done[job.id] = await until(lambda job=job: client.fine_tuning.jobs.retrieve(job.id),
                                   lambda j: j.status in TERMINAL, 420, f"job {job.id}")
    assert done[sft_job.id].status == "succeeded", done[sft_job.id]
    assert done[sft_job.id].trained_tokens
    assert done[dpo_job.id].status == "succeeded", done[dpo_job.id]
    # the registered model: OpenAI's `fine_tuned_model` on the job, the version in /v1/models
    done[sft_job.id] = await until(lambda: client.fine_tuning.jobs.retrieve(sft_job.id),
                                   lambda j: j.fine_tuned_model, 60, "fine_tuned_model")
    models = await until(lambda: client.models.list(extra_query={"job_id": sft_job.id}), lambda page: page.data,
                         60, "the registered model")
    model = await client.models.retrieve(models.data[0].id)
    assert model.id == models.data[0].id

    # -- list with pagination (the client follows `after` while has_more)
    ids = [j.id async for j in client.fine_tuning.jobs.list(limit=1)]
    assert sorted(ids) == sorted([sft_job.id, dpo_job.id, doomed.id])

    # -- events, newest first, paged; checkpoints with step numbers and metrics
    first = await client.fine_tuning.jobs.list_events(sft_job.id, limit=2)
    assert len(first.data) == 2 and first.has_more and first.data[0].object == "fine_tuning.job.event"
    events = [e async for e in client.fine_tuning.jobs.list_events(sft_job.id, limit=5)]
    assert len(events) >= 5 and len({e.id for e in events}) == len(events)
    assert events[0].created_at >= events[-1].created_at
    checkpoints = (await client.fine_tuning.jobs.checkpoints.list(sft_job.id)).data
    assert checkpoints and all(c.object == "fine_tuning.job.checkpoint" and c.step_number > 0 for c in checkpoints)
    assert all(c.fine_tuned_model_checkpoint for c in checkpoints)
    # metrics under OpenAI's names: the step, the training loss and token accuracy at that step, validation
    # loss and token accuracy (the whole validation split, so also OpenAI's full_valid_*)
    assert all(c.metrics.step == c.step_number for c in checkpoints)
    assert any(c.metrics.train_loss is not None for c in checkpoints), checkpoints
    periodic = [c for c in checkpoints if c.model_extra.get("kind") == "periodic"]
    assert periodic and all(c.metrics.valid_loss is not None and c.metrics.full_valid_loss == c.metrics.valid_loss
                            and 0 <= c.metrics.valid_mean_token_accuracy <= 1 for c in periodic), periodic

    # -- another tenant's key: 404 on every object, never its data
    calls = [other.files.retrieve(sft.id), other.files.content(sft.id), other.files.delete(sft.id),
             other.fine_tuning.jobs.retrieve(sft_job.id), other.fine_tuning.jobs.cancel(sft_job.id),
             other.fine_tuning.jobs.list_events(sft_job.id), other.fine_tuning.jobs.checkpoints.list(sft_job.id),
             other.models.retrieve(model.id)]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            await call
    assert (await other.fine_tuning.jobs.list()).data == []
    assert (await other.files.list()).data == []

    # -- a file in use by a finished job can be deleted; the model stays
    deleted = await client.files.delete(dpo.id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(dpo.id)
    # -- bad input: an unknown method type, out-of-range hyperparameters, an unknown file -> 400 naming it
    for kwargs, param in (({"method": {"type": "rlhf"}}, "method"),
                          ({"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}}},
                           "method.supervised.hyperparameters.n_epochs")):
        with pytest.raises(openai.BadRequestError) as exc:
            await client.fine_tuning.jobs.create(model="tiny-llama", training_file=sft.id, **kwargs)
        assert (exc.value.body or {}).get("param", "").startswith(param), exc.value.body
    # -- no key, a revoked or wrong key: 401 AuthenticationError
    bad = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="wsk-000000000000-" + "0" * 48, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.fine_tuning.jobs.list()

    # OpenAI's clients address a fine-tuned model by the job's `fine_tuned_model` (chat completions, retrieve):
    # the registry resolves that name to its current version.
    name = done[sft_job.id].fine_tuned_model
    by_name = await client.models.retrieve(name)
    versions = await client.models.list(extra_query={"name": name})
    assert by_name.id in {v.id for v in versions.data} and model.id in {v.id for v in versions.data}
