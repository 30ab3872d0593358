"""A file's life is honest. The official `openai` client against the gateway, with
ingest and the scheduler on the embedded stack (no trainer: a queued job stays queued).

Each upload is its own file (identical bytes too); deleting one leaves the other whole. A create naming
a deleted, unknown, another tenant's or rejected file answers 400 at once, naming the file. A delete
while a job is queued on the file answers 409 `file_in_use`; a delete that crosses a job still
validating its file wins, and that job fails with `training_file_deleted`."""

import json
import time

import openai
import pytest

from whetstone.devstack.testing import until, wait_until

pytestmark = pytest.mark.integration


def rows(n: int, tag: str) -> bytes:
    return b"".join(json.dumps({"messages": [{"role": "user", "content": f"{tag}: what is {i} plus one?"},
                                             {"role": "assistant", "content": f"It is {i + 1}."}]}).encode() + b"\n"
                    for i in range(n))


async def processed(client: openai.AsyncOpenAI, file_id: str) -> openai.types.FileObject:
    return await until(lambda: client.files.retrieve(file_id), lambda f: f.status != "uploaded", 90,
                       f"validation of {file_id}")


async def refused(client: openai.AsyncOpenAI, model: str, training_file: str, code: str) -> dict:
    """jobs.create answers 400 at once (no job is made) with this code, naming the file."""
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as exc:
        await client.fine_tuning.jobs.create(model=model, training_file=training_file)
    body = exc.value.body or {}
    assert body.get("code") == code and body.get("param") == "training_file", body
    assert training_file in body.get("message", ""), body
    assert time.monotonic() - started < 10, "not at once"   # an unknown `ds-` id waits 30 s before it fails
    return body


async def test_a_files_life_is_honest(platform, fake_model, openai_clients):
    from whetstone.ingest.bootstrap import build_service as ingest
    from whetstone.scheduler.bootstrap import build_service as scheduler

    async with platform(scheduler, ingest) as p:
        upstreams = {"scheduler": p.url("scheduler"), "ingest": p.url("ingest")}
        async with openai_clients(upstreams, retries=(0, 0)) as (client, other):
            await files_and_jobs(p, client, other, fake_model)


async def files_and_jobs(p, client: openai.AsyncOpenAI, other: openai.AsyncOpenAI, model: str) -> None:
    deletions = "SELECT count(*) FROM dataset_deletions WHERE dataset_id = $1"

    # -- identical bytes uploaded twice: two files, each with its own id; both validated (the second takes
    # the first's verdict); deleting one leaves the other readable, its bytes whole
    data = rows(16, "same")
    first = await client.files.create(file=("a.jsonl", data), purpose="fine-tune")
    second = await client.files.create(file=("b.jsonl", data), purpose="fine-tune")
    assert first.id != second.id and first.id.startswith("file-") and second.id.startswith("file-")
    for f in (first, second):
        assert (await processed(client, f.id)).status == "processed"
    assert (await client.files.delete(first.id)).deleted is True
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(first.id)
    kept = await client.files.retrieve(second.id)
    assert kept.status == "processed" and kept.filename == "b.jsonl"
    assert (await client.files.content(second.id)).content == data

    # -- a deleted file cannot be trained on: 400 naming it (once the scheduler heard of the delete)
    await wait_until(lambda: p["scheduler"].pool.fetchval(deletions, first.id), 30, "dataset.deleted projected")
    await refused(client, model, first.id, "training_file_deleted")

    # -- an unknown id, a forged one, another tenant's file: 400 at once, as OpenAI answers
    await refused(client, model, "file-doesnotexist", "training_file_not_found")
    await refused(client, model, "file-" + "0" * 40, "training_file_not_found")
    await refused(other, model, second.id, "training_file_not_found")

    # -- a rejected file: 400 at once with the validation's reasons
    bad = await client.files.create(file=("bad.jsonl", rows(12, "bad") + b"{not json\n"), purpose="fine-tune")
    assert (await processed(client, bad.id)).status == "error"
    # the files API answers from ingest; the job API from the scheduler, once the verdict reached it
    verdicts = "SELECT count(*) FROM datasets WHERE dataset_id = $1"
    await wait_until(lambda: p["scheduler"].pool.fetchval(verdicts, bad.id), 30, "dataset.validated projected")
    body = await refused(client, model, bad.id, "invalid_training_file")
    assert "line 13" in body["message"], body
    assert (await client.fine_tuning.jobs.list()).data == []   # none of the refusals made a job

    # -- a job queued on a file: the delete answers 409 file_in_use (no client retry), the file stays;
    # once the job ends the delete goes through
    job = await client.fine_tuning.jobs.create(model=model, training_file=second.id)
    await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.status == "queued", 30, "queued")
    in_use = "SELECT count(*) FROM file_usage WHERE file_id = $1 AND ended_at IS NULL"
    await wait_until(lambda: p["ingest"].pool.fetchval(in_use, second.id), 30, "job.queued projected by ingest")
    with pytest.raises(openai.ConflictError) as exc:
        await client.files.delete(second.id)
    assert exc.value.body["code"] == "file_in_use" and job.id in exc.value.body["message"], exc.value.body
    assert (await client.files.retrieve(second.id)).status == "processed"
    await client.fine_tuning.jobs.cancel(job.id)
    await wait_until(lambda: _released(p, second.id), 30, "job end projected by ingest")
    assert (await client.files.delete(second.id)).deleted is True

    # -- a delete that crosses a job still validating its file: the delete wins, the job fails with the
    # reason (ingest had not heard of the job yet, so it could not refuse the delete)
    late = await client.files.create(file=("late.jsonl", rows(400, "late")), purpose="fine-tune")
    crossing = await client.fine_tuning.jobs.create(model=model, training_file=late.id)
    assert crossing.status == "validating_files", crossing
    assert (await client.files.delete(late.id)).deleted is True
    failed = await until(lambda: client.fine_tuning.jobs.retrieve(crossing.id),
                         lambda j: j.status in ("succeeded", "failed", "cancelled"), 30, "the crossing job ends")
    assert failed.status == "failed" and failed.error.code == "training_file_deleted", failed
    assert late.id in failed.error.message
    await refused(client, model, late.id, "training_file_deleted")


async def _released(p, file_id: str) -> bool:
    return not await p["ingest"].pool.fetchval(
        "SELECT count(*) FROM file_usage WHERE file_id = $1 AND ended_at IS NULL", file_id)
