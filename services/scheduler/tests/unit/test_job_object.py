"""The job API's answer (`FineTuningJob`, OpenAI's `fine_tuning.job` with the platform's fields) as
FastAPI writes it: byte for byte the JSON recorded in fixtures/job_views/ (written by the view before
it had a response model, through a route typed `-> dict`), for jobs of every method family and state."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from whetstone.contracts import (
    CostEstimate, EvalCompletedV1, EvalStageResult, Hyperparameters, Integration, ReinforcementSpec,
    TrainingSpec,
)
from whetstone.contracts.enums import CheckpointKind, ErrorClass, PreemptRequestReason, SpecMethod
from whetstone.runtime.http import ListPage, list_page
from whetstone.scheduler.domain.forecast import Forecast
from whetstone.scheduler.domain.job import Job, new_job
from whetstone.scheduler.domain.job_data import (
    JobRequest, JobResources, MemoryGb, PlacedPart, Progress, QuotaRecord, TemplateUse,
)
from whetstone.scheduler.domain.placement import Shape
from whetstone.scheduler.entrypoints.job_object import FineTuningJob
from whetstone.scheduler.entrypoints.views import job_view

pytestmark = pytest.mark.unit
RECORDED = Path(__file__).parent.parent / "fixtures" / "job_views"
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
RESOURCES = JobResources(shapes=(Shape("A100", 1, 1), Shape("H100", 1, 1)), memory_gb=MemoryGb(weights=1.0, total=3.5),
                         params=494_000_000, params_source="safetensors")
GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
          "reference": "{{item.answer}}", "operation": "eq"}


def spec(method: SpecMethod, hp: dict[str, object]) -> TrainingSpec:
    return TrainingSpec(base_model="Qwen/Qwen2.5-0.5B-Instruct", base_model_sha256="a" * 64, dataset_id="ds-1",
                        dataset_version="v1", train_uri="s3://w/train.jsonl", method=method, hyperparameters=hp,
                        hyperparameters_hash="h" * 64)


def job(job_id: str, request: JobRequest) -> Job:
    return new_job(job_id, "demo", "fp", request, "standard", request.model, "a" * 64, RESOURCES, T0, "trace-1")


def supervised_queued() -> tuple[Job, Forecast | None]:
    req = JobRequest(job_id="ftjob-sft", idempotency_key="k1", model="Qwen/Qwen2.5-0.5B-Instruct",
                     training_file="file-1", validation_file="file-2", method=SpecMethod.LORA,
                     hyperparameters=Hyperparameters(n_epochs=2, learning_rate=0.0004, seed=7), suffix="demo",
                     metadata={"team": "search"}, template=TemplateUse(name="nightly", version=2, overrides=["suffix"]),
                     integrations=[Integration.model_validate({"type": "wandb", "wandb": {"project": "p"}})],
                     eval_config={"held_out": {"max_loss_increase": 0.1}})
    j = job("ftjob-sft", req)
    hp = Hyperparameters(n_epochs=2, learning_rate=0.0004, batch_size=4, gradient_accumulation_steps=2, lora_r=16,
                         lora_alpha=32, max_seq_len=1024, seed=7, gradient_checkpointing=False).model_dump(exclude_none=True)
    j.queue(T0, spec(SpecMethod.LORA, hp), 10.0, 640.0, QuotaRecord(estimated_gpu_hours=0.2), 1, CostEstimate())
    return j, Forecast(1, T0.timestamp() + 60)


def dpo_running() -> tuple[Job, Forecast | None]:
    req = JobRequest(job_id="ftjob-dpo", idempotency_key="k2", model="Qwen/Qwen2.5-0.5B-Instruct",
                     training_file="file-3", method=SpecMethod.DPO, hyperparameters=Hyperparameters(beta=0.2))
    j = job("ftjob-dpo", req)
    j.queue(T0, spec(SpecMethod.DPO, {"n_epochs": 1, "learning_rate": 5e-06, "batch_size": "auto", "beta": 0.2}),
            10.0, 900.0, QuotaRecord(), 0, CostEstimate())
    j.assign(T0, [PlacedPart(node_id="n1", gpu_ids=[0])], Shape("A100", 1, 1), False, False, 3600.0, {})
    j.started(T0, "n1", T0, 100, None)
    j.progress = Progress(step=40, total_steps=100, loss=0.61, tokens_per_s=812.5)
    assert j.segment_id is not None
    j.checkpoint_written(T0 + timedelta(minutes=3), j.segment_id, CheckpointKind.PERIODIC, 40, "s3://ck/40", "b" * 64,
                         T0 + timedelta(minutes=3))
    j.request_preemption(T0 + timedelta(minutes=4), PreemptRequestReason.PRIORITY, "preempted", "ftjob-urgent")
    return j, None


def reinforcement_validating() -> tuple[Job, Forecast | None]:
    rft = ReinforcementSpec(grader=GRADER, n_epochs=1, batch_size=8, learning_rate=1e-05, generations=8,
                            eval_interval=5, eval_samples=2, max_completion_tokens=256, base_quantization="nf4",
                            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {}}})
    req = JobRequest(job_id="ftjob-rft", idempotency_key="k3", model="Qwen/Qwen2.5-0.5B-Instruct",
                     training_file="file-4", method=SpecMethod.REINFORCEMENT, reinforcement=rft)
    return job("ftjob-rft", req), None


def reinforcement_without_spec() -> tuple[Job, Forecast | None]:
    req = JobRequest(job_id="ftjob-rft0", idempotency_key="k4", model="m", training_file="file-5",
                     method=SpecMethod.REINFORCEMENT)
    return job("ftjob-rft0", req), None


def merge_succeeded() -> tuple[Job, Forecast | None]:
    req = JobRequest(job_id="ftjob-merge", idempotency_key="merge-1", model="Qwen/Qwen2.5-0.5B-Instruct",
                     training_file="ft:model-1", method=SpecMethod.MERGE, metadata={"merge_id": "merge-1"})
    j = job("ftjob-merge", req)
    j.queue(T0, spec(SpecMethod.MERGE, {}), 10.0, 60.0, QuotaRecord(), 0, CostEstimate(merge_id="merge-1"))
    j.eval = EvalCompletedV1(job_id="ftjob-merge", checkpoint_uri="s3://ck/final", verdict="passed", reasons=["ok"],
                             metrics=[], stages=[EvalStageResult(name="held_out", status="passed", reason="loss within bounds")])
    j.fine_tuned_model, j.trained_tokens, j.finished_at = "ft:qwen:demo:x", 1234, T0 + timedelta(hours=1)
    return j, None


def failed() -> tuple[Job, Forecast | None]:
    req = JobRequest(job_id="ftjob-bad", idempotency_key="k5", model="m", training_file="file-6")
    j = job("ftjob-bad", req)
    j.fail(T0, "invalid_training_file", "dataset file-6 was rejected", ErrorClass.USER, param="training_file")
    return j, None


JOBS = {f.__name__: f for f in (supervised_queued, dpo_running, reinforcement_validating, reinforcement_without_spec,
                                merge_succeeded, failed)}


def app_of(jobs: dict[str, tuple[Job, Forecast | None]]) -> TestClient:
    app = FastAPI()

    @app.get("/jobs/{name}")
    async def one(name: str) -> FineTuningJob:
        return job_view(*jobs[name])

    @app.get("/jobs")
    async def many() -> ListPage[FineTuningJob]:
        return list_page([job_view(*jobs[name]) for name in sorted(jobs)], False)

    return TestClient(app)


def test_each_job_answers_the_recorded_json_byte_for_byte():
    client = app_of({name: build() for name, build in JOBS.items()})
    for name in JOBS:
        answer = client.get(f"/jobs/{name}")
        assert answer.status_code == 200, answer.text
        assert answer.content == (RECORDED / f"{name}.json").read_bytes().rstrip(b"\n"), name
    listed = client.get("/jobs")
    assert listed.content == (RECORDED / "_list.json").read_bytes().rstrip(b"\n")


def test_the_openapi_document_describes_the_job_object():
    client = app_of({})
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    job_schema = schemas["FineTuningJob"]["properties"]
    assert {"id", "status", "method", "hyperparameters", "state", "resources", "eval"} <= set(job_schema)
    method = schemas["MethodObject"]["properties"]
    assert {"type", "supervised", "dpo", "reinforcement", "whetstone"} <= set(method)
