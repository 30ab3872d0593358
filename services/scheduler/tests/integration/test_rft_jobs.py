"""Reinforcement jobs through the official client: `method.type == "reinforcement"` with OpenAI's
`reinforcement` object is accepted and recorded (the grader and resolved knobs reach the job's
TrainingSpec), a training file that is not RFT data is refused naming why, and every bad method
object is a 400 naming the field before any job exists."""

from __future__ import annotations

import httpx
import openai
import pytest

from whetstone.contracts import DatasetValidatedV1
from whetstone.devstack.grader_samples import EXACT_OR_CLOSE as GRADER
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration



async def dataset(settings, dataset_id: str, purpose: str, schema: str | None) -> None:
    await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
        dataset_id=dataset_id, version="ab" * 32, name="d.jsonl", status="accepted", purpose=purpose,
        data_schema=schema, rows_total=20, rows_kept=20, tokens_total=2000,
        train_uri=f"s3://whetstone/tenants/demo/datasets/{dataset_id}/train.jsonl"), "demo")


async def test_reinforcement_jobs_are_accepted_recorded_and_checked(platform, settings, tiny_model, monkeypatch):
    monkeypatch.setenv("WHETSTONE_SCHEDULER_UNKNOWN_DATASET_GRACE_S", "1")
    monkeypatch.setenv("WHETSTONE_SCHEDULER_DATASET_WAIT_S", "10")   # a validation file never validated
    async with platform(lambda: build_service(SchedulerSettings())) as p:
        rt = p["scheduler"]
        api = openai.AsyncOpenAI(base_url=p.url("scheduler") + "/v1", api_key="unused",
                                 http_client=httpx.AsyncClient(auth=IdentityAuth("demo", ("read", "write")), timeout=60), max_retries=0)
        await dataset(settings, "file-rft", "rft", None)
        await dataset(settings, "file-chat", "sft", "chat")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 2 FROM datasets"), 30, "datasets")

        method = {"type": "reinforcement", "reinforcement": {
            "grader": GRADER, "hyperparameters": {"n_epochs": 2, "batch_size": 4, "compute_multiplier": 1.5,
                                                  "eval_interval": "auto", "reasoning_effort": "low"},
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}}}
        job = await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-rft", method=method, seed=3)
        assert job.method.type == "reinforcement"
        assert job.method.reinforcement.grader.name == "reward"
        hp = job.method.reinforcement.hyperparameters
        assert hp.n_epochs == 2 and hp.batch_size == 4 and hp.reasoning_effort == "low"
        queued = await wait_until(lambda: outbox(rt, "job.queued"), 30, "job.queued")
        spec = queued[0]["payload"]["spec"]
        assert spec["method"] == "reinforcement" and spec["reinforcement"]["grader"]["graders"]["exact"]["name"] == \
            "exact"
        assert spec["reinforcement"]["generations"] == 6 and spec["reinforcement"]["max_completion_tokens"] == 128
        assert spec["reinforcement"]["response_format"]["type"] == "json_schema"
        # a validation file nobody uploads, named by a content address (a producer may still publish it, so
        # the job waits; a `file-` id nobody uploaded is a 400): it fails after dataset_wait_s naming it
        orphan = await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-rft", method=method,
                                                   validation_file="ds-never")
        fetched = await api.fine_tuning.jobs.retrieve(job.id)
        assert fetched.method.reinforcement.hyperparameters.n_epochs == 2 and fetched.seed == 3

        # chat data cannot train a reinforcement job: refused at once (the dataset is known), the reason named
        with pytest.raises(openai.BadRequestError) as caught:
            await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-chat", method=method)
        assert caught.value.body["code"] == "method_dataset_mismatch" and caught.value.body["param"] == "training_file"
        assert "rft dataset" in caught.value.body["message"]

        # refused before a job exists, the field named
        def rft(**changes) -> dict:
            return {"type": "reinforcement", "reinforcement": {"grader": GRADER, **changes}}

        cases = [
            (rft(hyperparameters={"n_epochs": -1}), "method.reinforcement.hyperparameters.n_epochs"),
            (rft(hyperparameters={"beta": 0.1}), "method.reinforcement.hyperparameters.beta"),
            (rft(temperature=0.7), "method.reinforcement.temperature"),
            (rft(grader={**GRADER, "calculate_output": "exact + __import__(close)"}),
             "method.reinforcement.grader.calculate_output"),
            (rft(grader={**GRADER, "calculate_output": "exact + bonus"}), "method.reinforcement.grader.calculate_output"),
            (rft(grader={"type": "score_model", "name": "j", "model": "gpt-4o",
                         "input": [{"role": "user", "content": "{{sample.output_text}}"}]}),
             "method.reinforcement.grader.model"),
            (rft(grader={**GRADER["graders"]["exact"], "input": "{{secrets.key}}"}), "method.reinforcement.grader.input"),
            ({"type": "reinforcement"}, "method.reinforcement"),
            ({"type": "reinforcement", "reinforcement": {"grader": GRADER}, "supervised": {}}, "method.supervised"),
            ({**rft(), "whetstone": {"method": "full"}}, "method.whetstone.method"),
        ]
        for bad, param in cases:
            with pytest.raises(openai.BadRequestError) as caught:
                await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-rft", method=bad)
            assert caught.value.body["param"] == param, (bad, caught.value.body)
        assert await rt.pool.fetchval("SELECT count(*) FROM jobs") == 2

        # a validation file: the job waits for its verdict too, then holds out that file's rows (validation
        # during training, the gate's held-out prompts) instead of the training file's split; QLoRA (the
        # platform's method extension) loads the base in 4-bit NF4
        held = await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-rft",
                                                 method={**method, "whetstone": {"method": "qlora"}},
                                                 validation_file="ds-rft-val", seed=4)
        assert held.status == "validating_files"
        await dataset(settings, "ds-rft-val", "rft", None)

        async def both_queued() -> list[dict] | None:
            queued = await outbox(rt, "job.queued")
            return queued if len(queued) == 2 else None

        specs = await wait_until(both_queued, 30, "the second job.queued")
        spec = next(q["payload"]["spec"] for q in specs if q["payload"]["job_id"] == held.id)
        assert spec["validation_uri"].endswith("/ds-rft-val/train.jsonl"), spec
        assert spec["reinforcement"]["base_quantization"] == "nf4" and queued[0]["payload"]["spec"]["reinforcement"][
            "base_quantization"] is None
        assert (await api.fine_tuning.jobs.retrieve(held.id)).method.whetstone == {"method": "qlora"}
        # chat data cannot hold out a reinforcement job's prompts: refused, the validation file named
        with pytest.raises(openai.BadRequestError) as caught:
            await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-rft", method=method,
                                              validation_file="file-chat")
        assert caught.value.body["param"] == "validation_file" and "rft dataset" in caught.value.body["message"]

        async def orphan_failed():
            found = await api.fine_tuning.jobs.retrieve(orphan.id)
            return found if found.status == "failed" else None

        failed = await wait_until(orphan_failed, 30, "the job waiting for a validation file to fail")
        assert failed.error.code == "validation_file_not_validated" and failed.error.param == "validation_file"
        assert "'ds-never'" in failed.error.message
