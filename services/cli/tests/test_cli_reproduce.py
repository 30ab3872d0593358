"""`whet jobs reproduce`: the create body that pins everything of a job (pure; the end-to-end run, equal
losses included, is tests/integration/test_openai_models.py)."""

import pytest
from whetstone.cli.errors import BadInput
from whetstone.cli.job_request import request_json
from whetstone.cli.reproduce import JobAnswer, reproduce_body

pytestmark = pytest.mark.unit

JOB = {"id": "ftjob-1", "state": "succeeded", "model": "tiny-llama", "training_file": "file-t",
       "validation_file": "file-v", "user_provided_suffix": "s", "eval_config": {"stages": ["holdout"]},
       "metadata": {"team": "a"}, "tier": "standard", "integrations": [], "base_model_sha256": "ab" * 32,
       "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3}},
                  "whetstone": {"method": "qlora"}},
       "resolved_hyperparameters": {"n_epochs": 3, "batch_size": 4, "gradient_accumulation_steps": 2,
                                    "gradient_checkpointing": False, "learning_rate": 2e-4, "seed": 42,
                                    "lora_r": 16, "lora_alpha": 32, "not_an_api_knob": 1}}


def reproduce(answer: dict) -> dict:
    """The body as it goes on the wire."""
    return request_json(reproduce_body(JobAnswer.from_api(answer)))


def test_every_resolved_knob_the_base_pin_and_the_files_are_sent():
    body = reproduce(JOB)
    hp = body["method"]["supervised"]["hyperparameters"]
    assert hp == {k: v for k, v in JOB["resolved_hyperparameters"].items() if k != "not_an_api_knob"}
    assert body["method"]["whetstone"] == {"method": "qlora"} and body["method"]["type"] == "supervised"
    assert (body["model"], body["training_file"], body["validation_file"], body["base_model_sha256"]) == (
        "tiny-llama", "file-t", "file-v", "ab" * 32)
    assert body["metadata"] == {"team": "a", "reproduces": "ftjob-1"} and body["suffix"] == "s"
    assert "integrations" not in body and body["eval_config"] == {"stages": ["holdout"]}
    assert "image" not in body   # a job pinned to no image is reproduced on any


def test_the_trainer_image_a_template_pinned_is_kept():
    pin = "ghcr.io/whetstone/trainer@sha256:" + "c" * 64
    assert reproduce({**JOB, "image": pin})["image"] == pin


def test_a_job_never_admitted_or_of_another_method_is_refused_by_name():
    with pytest.raises(BadInput, match="never admitted"):
        reproduce({**JOB, "resolved_hyperparameters": None, "state": "failed"})
    with pytest.raises(BadInput, match="reinforcement"):
        reproduce({**JOB, "method": {"type": "reinforcement"}})


def test_the_integrations_are_kept_as_the_contract_reads_them():
    wandb = {"type": "wandb", "wandb": {"project": "p", "name": None, "entity": None, "tags": ["a"]}}
    assert reproduce({**JOB, "integrations": [wandb]})["integrations"] == [
        {"type": "wandb", "wandb": {"project": "p", "tags": ["a"]}}]
