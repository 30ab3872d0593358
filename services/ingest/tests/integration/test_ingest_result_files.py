"""Results files from the bus: ingest keeps each step's figures from job.progress and
checkpoint.written, and when training ends the job's CSV becomes a file of the tenant's (purpose
fine-tune-results), announced on file.created and readable with the official client's files.content.
A job whose job.queued asked for W&B gets a second result file: a W&B offline run of the same figures."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import httpx
import openai
import pytest

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, JobCancelledV1, JobCompletedV1, JobFailedV1, JobProgressV1, JobQueuedV1,
    Resources, TrainingSpec, result_file_id_for,
)
from whetstone.contracts.integrations import Integration
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.devstack.wandb_runs import read_offline_run
from whetstone.ingest.bootstrap import build_service
from whetstone.runtime.identity import IdentityAuth

pytestmark = pytest.mark.integration


def progress(job: str, step: int, attempt: int = 1, **fields) -> JobProgressV1:
    return JobProgressV1(job_id=job, segment_id=f"{job}:{attempt}", attempt=attempt, step=step, **fields)


def queued_with_wandb(job: str) -> JobQueuedV1:
    spec = TrainingSpec(base_model="tiny-llama", base_model_sha256="a" * 64, dataset_id="file-train",
                        dataset_version="v", train_uri="s3://whetstone/t", method="lora",
                        hyperparameters={"n_epochs": 1, "learning_rate": 0.001, "lora_r": 8}, hyperparameters_hash="h")
    wandb = Integration.model_validate({"type": "wandb", "wandb": {"project": "tiny", "name": "run-a",
                                                                   "entity": "team", "tags": ["exp1"]}})
    return JobQueuedV1(job_id=job, tier="standard", spec=spec, resources=Resources(gpu_type="cpu", gpus_per_node=1),
                       integrations=[wandb])


async def created(rt, job: str) -> list[dict]:
    return [e for e in await outbox(rt, "file.created") if e["payload"]["job_id"] == job]


async def test_results_file_made_once_from_progress_events(platform, settings):
    b = settings.kafka_bootstrap
    job, cancelled = "ftjob-results000000000001", "ftjob-results000000000002"
    tracked = "ftjob-results000000000004"   # asked for W&B: its offline run is a second result file
    await send_event(b, queued_with_wandb(tracked), "demo")
    await send_event(b, queued_with_wandb(cancelled), "demo")
    for step in (1, 2, 3):
        await send_event(b, progress(tracked, step, loss=2.0 - step / 4, token_accuracy=0.2 * step,
                                     learning_rate=1e-3 / step), "demo")
    await send_event(b, JobCompletedV1(job_id=tracked, segment_id=f"{tracked}:1", attempt=1, node_id="n", steps=3,
                                       stopped_at=datetime.now(UTC), final_checkpoint=CheckpointRef(
                                           uri="s3://whetstone/tenants/demo/y", step=3, manifest_sha256="0" * 64)),
                     "demo")
    # a second end of training (the gate's verdict) makes neither file again
    await send_event(b, JobFailedV1(job_id=tracked, code="eval_failed", message="gate", error_class="user"), "demo")
    for step in (1, 2, 3):
        await send_event(b, progress(job, step, loss=3.0 - step / 2, token_accuracy=0.1 * step, learning_rate=1e-3,
                                     epoch=step / 3), "demo")
    # step 3 trained again by a second attempt after a preemption: its figures win
    await send_event(b, progress(job, 3, attempt=2, loss=1.25, token_accuracy=0.5), "demo")
    await send_event(b, CheckpointWrittenV1(job_id=job, segment_id=f"{job}:2", attempt=2, checkpoint_id="c3",
                                            kind="final", step=3, uri="s3://whetstone/tenants/demo/x",
                                            manifest_sha256="0" * 64, files=1, size_bytes=1,
                                            written_at=datetime.now(UTC), metrics={"validation_loss": 1.5}), "demo")
    await send_event(b, JobCompletedV1(job_id=job, segment_id=f"{job}:2", attempt=2, node_id="n", steps=3,
                                       stopped_at=datetime.now(UTC), final_checkpoint=CheckpointRef(
                                           uri="s3://whetstone/tenants/demo/x", step=3, manifest_sha256="0" * 64)),
                     "demo")
    await send_event(b, JobFailedV1(job_id=job, code="eval_failed", message="gate", error_class="user"), "demo")
    await send_event(b, progress(cancelled, 1, loss=2.0), "demo")
    await send_event(b, JobCancelledV1(job_id=cancelled), "demo")
    async with platform(build_service) as p:
        rt = p["ingest"]

        async def announced():
            return await created(rt, job) or None
        [env] = await wait_until(announced, 60, "file.created")
        file_id = result_file_id_for(job)
        assert env["payload"]["file_id"] == file_id and env["payload"]["job_id"] == job
        assert env["tenant_id"] == "demo" and env["payload"]["purpose"] == "fine-tune-results"

        client, other = (openai.AsyncOpenAI(base_url=p.url("ingest") + "/v1", api_key="unused", max_retries=0,
                                            http_client=httpx.AsyncClient(auth=IdentityAuth(t, ("read",)), timeout=60))
                         for t in ("demo", "acme"))
        f = await client.files.retrieve(file_id)
        assert (f.purpose, f.status, f.filename) == ("fine-tune-results", "processed", f"{job}-results.csv")
        # topics are not ordered with each other: a step read after the end of training rewrites the file

        async def complete():
            text = (await client.files.content(file_id)).text
            rows = list(csv.DictReader(io.StringIO(text)))
            last = rows[2] if len(rows) == 3 else {}
            # both of the second attempt's reports of step 3 (progress and checkpoint) arrived, in either order
            return (text, rows) if last.get("valid_loss") and last.get("train_loss") == "1.25" else None
        text, rows = await wait_until(complete, 30, "the three steps in the results file")
        f = await client.files.retrieve(file_id)
        assert text.startswith("step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy,")
        assert [r["step"] for r in rows] == ["1", "2", "3"] and f.bytes == len(text.encode())
        assert float(rows[0]["train_loss"]) == 2.5 and float(rows[1]["train_accuracy"]) == 0.2
        assert (rows[2]["train_loss"], rows[2]["valid_loss"], rows[2]["attempt"]) == ("1.25", "1.5", "2")
        assert rows[2]["learning_rate"] == ""   # the second attempt's report replaced the first's
        assert file_id in [x.id for x in (await client.files.list(purpose="fine-tune-results")).data]
        with pytest.raises(openai.NotFoundError):
            await other.files.content(file_id)
        # the cancelled job made none; its figures are gone
        assert not await rt.pool.fetchval("SELECT count(*) FROM job_step_metrics WHERE job_id = $1", cancelled)
        # the W&B job's two result files: the CSV and the offline run
        async def both():
            made = await created(rt, tracked)
            return made if len(made) == 2 else None
        csv_env, wb_env = sorted(await wait_until(both, 90, "the W&B job's two result files"),
                                 key=lambda e: e["payload"]["filename"].endswith(".tar.gz"))
        assert csv_env["payload"]["file_id"] == result_file_id_for(tracked)
        wb_id = wb_env["payload"]["file_id"]
        # a report read after the file was made: the same file, rewritten (the W&B run written again)
        await send_event(b, progress(job, 4, attempt=2, loss=1.0), "demo")
        await send_event(b, progress(tracked, 4, loss=1.0, validation_loss=1.1), "demo")

        async def four_rows():
            rows = list(csv.DictReader(io.StringIO((await client.files.content(file_id)).text)))
            return len(rows) == 4
        await wait_until(four_rows, 30, "the late step in the results file")
        assert (await client.files.retrieve(file_id)).bytes > f.bytes
        assert len(await created(rt, job)) == 1

        # training ended before any of the job's figures were read: the first figures read make the file
        early = "ftjob-results000000000003"
        await send_event(b, JobFailedV1(job_id=early, code="oom", message="out of memory", error_class="user"), "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM job_training_ended WHERE job_id = $1",
                                                  early), 30, "the end of training recorded")
        assert not await created(rt, early)
        await send_event(b, progress(early, 1, loss=2.0), "demo")

        async def made_late():
            return await created(rt, early) or None
        [late] = await wait_until(made_late, 30, "the results file of a job whose figures came after its end")
        rows = list(csv.DictReader(io.StringIO((await client.files.content(late["payload"]["file_id"])).text)))
        assert [(r["step"], r["train_loss"]) for r in rows] == [("1", "2")]

        # the W&B run, a real W&B offline run read back with the SDK's reader, holds every step once its row
        # is done with all four steps recorded (a step recorded later puts a done run back to pending)
        wb = await client.files.retrieve(wb_id)
        assert (wb.purpose, wb.filename) == ("fine-tune-results", f"{tracked}-wandb-offline.tar.gz")

        async def written():
            return await rt.pool.fetchval(
                "SELECT r.status = 'done' AND (SELECT count(*) FROM job_step_metrics m WHERE m.job_id = r.job_id) = 4"
                " FROM job_wandb_runs r WHERE r.job_id = $1", tracked)
        await wait_until(written, 90, "the W&B run written with the four steps")
        run = read_offline_run((await client.files.content(wb_id)).content)
        assert all(m.startswith("offline-run-") for m in run.members) and run.exit_code == 0
        assert (run.run.project, run.run.entity, run.run.display_name) == ("tiny", "team", "run-a")
        assert run.run.tags[:2] == ["exp1", "whetstone/finetune"]
        assert run.config.hyperparameters == {"n_epochs": 1, "learning_rate": 0.001, "lora_r": 8}
        assert (run.config.base_model, run.config.method, run.config.job_id) == ("tiny-llama", "lora", tracked)
        assert sorted(run.history) == [1, 2, 3, 4]
        assert run.history[1] == {"train_loss": 1.75, "train_accuracy": 0.2, "learning_rate": 0.001}
        assert run.history[4] == {"train_loss": 1.0, "valid_loss": 1.1}
        assert (run.summary["steps"], run.summary["best_valid_loss"]) == (4, 1.1)
        assert (await client.files.retrieve(wb_id)).bytes == len((await client.files.content(wb_id)).content)
        assert len(await created(rt, tracked)) == 2   # each file announced once
        with pytest.raises(openai.NotFoundError):
            await other.files.retrieve(wb_id)
        # the cancelled job that asked for W&B made no file of either kind
        assert not await created(rt, cancelled)
        # (its job.queued read before the cancel: the run is cancelled; after: never recorded)
        assert await rt.pool.fetchval("SELECT status FROM job_wandb_runs WHERE job_id = $1", cancelled) \
            in ("cancelled", None)
