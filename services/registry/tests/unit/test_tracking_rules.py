"""Experiment tracking's rules (domain/tracking.py): what a job's events become in MLflow, the batches MLflow
takes, the backoff; and the adapter's answer to a tracking server that is down (retry later, never raise
anything else)."""

import socket
from datetime import UTC, datetime

import pytest

from whetstone.contracts import EvalCompletedV1, JobProgressV1, JobQueuedV1, Metric
from whetstone.contracts.integrations import Integration
from whetstone.registry.adapters.mlflow import MlflowServer, TrackingUnavailable
from whetstone.registry.domain import tracking

pytestmark = pytest.mark.unit
AT = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


def queued(**extra) -> JobQueuedV1:
    return JobQueuedV1.model_validate({
        "job_id": "ftjob-1", "tier": "standard", "resources": {"gpu_type": "cpu", "gpus_per_node": 1},
        "spec": {"base_model": "tiny-llama", "base_model_sha256": "a" * 64, "dataset_id": "file-1",
                 "dataset_version": "v1", "train_uri": "s3://b/t", "method": "lora", "hyperparameters_hash": "h",
                 "hyperparameters": {"n_epochs": 3, "lora_r": 16, "learning_rate": 1e-3, "warmup": None,
                                     "note": "x" * 7000}}, **extra})


def test_a_job_without_mlflow_is_not_tracked_and_one_with_it_goes_under_its_tenant():
    assert tracking.mlflow_settings(queued()) is None
    wandb = Integration.model_validate({"type": "wandb", "wandb": {"project": "p"}})
    mlflow = Integration.model_validate({"type": "mlflow", "mlflow": {"experiment_name": "sweeps"}})
    settings = tracking.mlflow_settings(queued(integrations=[wandb, mlflow]))
    assert settings is not None and tracking.experiment_for("acme", settings) == "acme/sweeps"
    with pytest.raises(ValueError, match="exactly its own block"):
        Integration.model_validate({"type": "mlflow", "wandb": {"project": "p"}})


def test_params_are_the_base_files_and_every_resolved_hyperparameter_within_mlflow_limits():
    item = tracking.params_of(queued())
    params = {p.key: p.value for p in item.params}
    assert (params["base_model"], params["method"], params["training_file"]) == ("tiny-llama", "lora", "file-1")
    assert (params["hp.n_epochs"], params["hp.lora_r"], params["hp.learning_rate"]) == ("3", "16", "0.001")
    assert "hp.warmup" not in params and len(params["hp.note"]) == tracking.MAX_PARAM_VALUE
    assert [(t.key, t.value) for t in item.tags] == [(tracking.JOB_TAG, "ftjob-1")]


def test_a_step_becomes_metrics_at_that_step_stamped_with_the_event_time():
    ev = JobProgressV1(job_id="ftjob-1", segment_id="s", step=7, loss=2.5, validation_loss=2.7, learning_rate=1e-3)
    points = {m.key: (m.value, m.step, m.timestamp) for m in tracking.metrics_of(ev, AT).metrics}
    ms = int(AT.timestamp() * 1000)
    assert points == {"train_loss": (2.5, 7, ms), "valid_loss": (2.7, 7, ms), "learning_rate": (1e-3, 7, ms)}


def test_the_verdict_is_tagged_and_its_metrics_logged():
    ev = EvalCompletedV1(job_id="ftjob-1", checkpoint_uri="s3://b/c", verdict="failed", reasons=["worse"],
                         metrics=[Metric(name="holdout_loss", base=3.0, candidate=3.5)])
    item = tracking.verdict_of(ev, AT, step=0)
    assert {t.key: t.value for t in item.tags} == {"eval.verdict": "failed", "eval.reasons": "worse"}
    assert {m.key: m.value for m in item.metrics} == {"eval.holdout_loss": 3.5, "eval.base.holdout_loss": 3.0}
    names, card, end = tracking.registered("s3://b/README.md", "wsm-1", "ft:x", AT)
    assert (card[1].artifact and card[1].artifact.path, end[1].end) == ("model_card/README.md", "FINISHED")


def test_batches_respect_mlflows_limits_and_backoff_is_capped():
    item = tracking.TrackingItem(params=[tracking.Param(key=f"p{i}", value="v") for i in range(250)],
                                 metrics=[tracking.MetricPoint(key="m", value=1, timestamp=0, step=i)
                                          for i in range(1500)])
    split = tracking.batches(item)
    assert [(len(b.params), len(b.metrics)) for b in split] == [(100, 1000), (100, 500), (50, 0)]
    assert [tracking.retry_delay_s(n, 5) for n in (1, 2, 3, 20)] == [5, 10, 20, 300]


async def test_a_server_that_is_down_is_unavailable_not_an_error():
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = MlflowServer(f"http://127.0.0.1:{port}", timeout_s=2)
    try:
        with pytest.raises(TrackingUnavailable, match="experiments/get-by-name"):
            await server.experiment_id("demo/x")
    finally:
        await server.close()
