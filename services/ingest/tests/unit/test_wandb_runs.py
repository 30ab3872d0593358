"""What goes into a job's W&B offline run: the results table's figures by step, the summary, the run's
name, tags and config from the job's spec (the SDK writes it: tests/integration/test_ingest_result_files.py)."""

import pytest

from whetstone.contracts.integrations import WandbIntegration
from whetstone.ingest.domain.wandb_runs import WandbPlan, run_input, wandb_file_id_for, wandb_filename, wandb_run_id

pytestmark = pytest.mark.unit


def plan(**block) -> WandbPlan:
    return WandbPlan(job_id="ftjob-1", wandb=WandbIntegration(project="p", **block), base_model="tiny",
                     base_model_sha256="a" * 64, method="lora", hyperparameters={"n_epochs": 2}, dataset_id="file-1")


def test_history_and_summary_are_the_results_figures():
    rows = [(2, 1, {"train_loss": 1.5, "valid_loss": 1.7, "grad_norm": 0.3}),
            (1, 2, {"train_loss": 2.0, "learning_rate": 1e-3}), (3, 1, {"train_loss": 1.2, "valid_loss": 1.9})]
    run = run_input(plan(), rows)
    assert [s for s, _ in run.history] == [1, 2, 3]                 # by step, attempt left out
    assert run.history[0][1] == {"train_loss": 2.0, "learning_rate": 1e-3}
    assert run.summary == {"steps": 3, "last_step": 3, "train_loss": 1.2, "valid_loss": 1.9, "grad_norm": 0.3,
                           "learning_rate": 1e-3, "best_valid_loss": 1.7}
    assert run_input(plan(), []).summary == {"steps": 0}


def test_name_tags_and_config_follow_the_block_and_the_spec():
    run = run_input(plan(name="mine", entity="team", tags=["a", "whetstone/finetune"]), [])
    assert (run.project, run.entity, run.name, run.run_id) == ("p", "team", "mine", "ftjob-1")
    assert run.tags == ["a", "whetstone/finetune", "whetstone/tiny", "whetstone/ftjob-1"]   # no repeats
    assert run_input(plan(), []).name == "ftjob-1"                    # OpenAI's default: the job id
    long = WandbPlan(job_id="ftjob-1", wandb=WandbIntegration(project="p"), base_model="org/" + "m" * 80,
                     base_model_sha256="a" * 64, method="lora", dataset_id="file-1")
    assert all(len(t) <= 64 for t in long.tags)
    assert run.config["hyperparameters"] == {"n_epochs": 2} and run.config["base_model_sha256"] == "a" * 64
    assert wandb_run_id("ftjob/odd id") != "ftjob/odd id" and len(wandb_run_id("ftjob/odd id")) == 32
    assert wandb_filename("ftjob-1") == "ftjob-1-wandb-offline.tar.gz"
    assert wandb_file_id_for("ftjob-1") == wandb_file_id_for("ftjob-1") != wandb_file_id_for("ftjob-2")
