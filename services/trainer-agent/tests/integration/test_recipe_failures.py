"""Failures during training (in process, tiny Llama): out-of-memory retries keep the
effective batch, divergence stops early as a user error with advice, a bad example met
mid-run is named by its line. Faults are injected with the test-only hook (faults.py)."""

from __future__ import annotations

import pytest
import torch
from whetstone.devstack.recipe_harness import run_in_process
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    OomRetry,
    Progress,
    TrainingConfig,
)
from whetstone.trainer_agent.recipes.faults import Faults

pytestmark = pytest.mark.integration

HYPERPARAMETERS = {"n_epochs": 1, "batch_size": 4, "gradient_accumulation_steps": 1, "max_seq_len": 256,
                   "learning_rate": 1e-2, "lora_r": 4, "lora_dropout": 0.0, "seed": 0, "checkpoint_every_steps": 4,
                   "checkpoint_every_minutes": 0}


def config(job_id, base, data_files, out, method="lora", **hyperparameters) -> TrainingConfig:
    return TrainingConfig(job_id=job_id, base_model=str(base), train_file=data_files["train"], output_dir=out,
                          method=method, hyperparameters={**HYPERPARAMETERS, **hyperparameters})


@pytest.fixture(scope="module")
def reference(tiny_base, data_files, tmp_path_factory):
    work = tmp_path_factory.mktemp("reference")
    run = run_in_process(config("job-ref", tiny_base, data_files, work / "out"), work)
    assert run.returncode == 0, run.last
    return run


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_effective_batch(reference, tiny_base, data_files,
                                                                             tmp_path):
    # the very first forward runs out of memory: micro-batch 4 -> 2, accumulation 1 -> 2, from the start
    run = run_in_process(config("job-oom", tiny_base, data_files, tmp_path / "out"), tmp_path,
                         faults=Faults(oom_forwards=1))
    assert run.returncode == 0, run.last
    retry = run.of(OomRetry)
    assert [(r.attempt, r.micro_batch_size, r.gradient_accumulation_steps) for r in retry] == [(1, 2, 2)]
    assert retry[0].resume_step == 0
    assert (run.last.micro_batch_size, run.last.gradient_accumulation_steps) == (2, 2)
    assert run.last.oom_retries == 1 and run.names().count("started") == 1
    steps = sorted(reference.losses())
    assert sorted(run.losses()) == steps == list(range(1, 11))
    torch.testing.assert_close(torch.tensor([run.losses()[s] for s in steps]),
                               torch.tensor([reference.losses()[s] for s in steps]), rtol=1e-4, atol=1e-5)


def test_out_of_memory_retry_goes_on_from_the_segments_last_checkpoint(reference, tiny_base, data_files, tmp_path):
    # forward 6 = step 6, after the step-4 checkpoint: the retry resumes from checkpoint-4 at micro-batch 2;
    # then forward 9 (step 6 again, at micro-batch 2) fails too: micro-batch 1 from checkpoint-4 again
    run = run_in_process(config("job-oom-late", tiny_base, data_files, tmp_path / "out"), tmp_path,
                         faults=Faults(oom_at_forwards=[6, 9]))
    assert run.returncode == 0, run.last
    retries = [(r.micro_batch_size, r.gradient_accumulation_steps, r.resume_step) for r in run.of(OomRetry)]
    assert retries == [(2, 2, 4), (1, 4, 4)]
    assert [e.step for e in run.of(Progress)] == [1, 2, 3, 4, 5, 5, 5, 6, 7, 8, 9, 10]
    losses, expected = run.losses(), reference.losses()  # the last value of each step
    torch.testing.assert_close(torch.tensor([losses[s] for s in range(1, 11)]),
                               torch.tensor([expected[s] for s in range(1, 11)]), rtol=1e-4, atol=1e-5)


def test_out_of_memory_beyond_the_retries_fails_with_advice(tiny_base, data_files, tmp_path):
    run = run_in_process(config("job-oom-fail", tiny_base, data_files, tmp_path / "out", max_oom_retries=1),
                         tmp_path, faults=Faults(oom_forwards=100))
    assert run.returncode == 1
    assert run.names() == ["started", "oom_retry", "failed"]
    failed = run.last
    assert (failed.error_class, failed.code) == ("ambiguous", "out_of_memory")
    assert "micro-batch 2" in failed.message and "after 1 retries" in failed.message
    assert "lower max_seq_len" in failed.advice


def test_divergence_stops_early_as_a_user_error_with_advice(tiny_base, data_files, tmp_path):
    # on the demo data the loss at lr 0.99 climbs past 4x its minimum for two steps (7.8 -> 46 -> 36) and
    # then falls back: a patience of 2 must stop it there
    run = run_in_process(config("job-diverge", tiny_base, data_files, tmp_path / "out", method="full",
                                learning_rate=0.99, divergence_patience=2, max_grad_norm=0.0, warmup_ratio=0.0),
                         tmp_path)
    assert run.returncode == 1, [e.loss for e in run.of(Progress)]
    failed = run.last
    assert (failed.error_class, failed.code) == ("user", "loss_diverged")
    assert "running minimum" in failed.message
    assert any("lower learning_rate" in advice for advice in failed.advice)
    assert len(run.of(Progress)) < 10  # stopped early, not at the end
    assert not any(e.kind == "final" for e in run.of(Checkpoint))


def test_bad_example_met_mid_run_is_named(tiny_base, data_files, tmp_path):
    lines = [i for i, line in enumerate(data_files["train"].read_text().splitlines(), start=1) if line.strip()]
    bad_line = lines[17]
    run = run_in_process(config("job-poison", tiny_base, data_files, tmp_path / "out"), tmp_path,
                         faults=Faults(poison_line=bad_line))
    assert run.returncode == 1
    assert run.names()[0] == "started" and run.of(Progress)  # it was met mid-run, not at setup
    failed = run.last
    assert (failed.error_class, failed.code) == ("user", "bad_example")
    assert f"train.jsonl line {bad_line}:" in failed.message and "mid-run" in failed.message
