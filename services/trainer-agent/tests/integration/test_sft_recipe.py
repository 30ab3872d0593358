"""The LoRA SFT recipe as a real child process on the tiny Llama (CPU, ~10 s per run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from whetstone.devstack.recipe_harness import RecipeRun, run_subprocess
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    Failed,
    Preempted,
    Progress,
    Started,
    TrainingConfig,
)

pytestmark = pytest.mark.integration



def read_rows(path: Path) -> list[list[dict]]:
    """The `messages` of every row of a chat JSONL file."""
    return [json.loads(line)["messages"] for line in path.read_text().splitlines() if line.strip()]


def run_recipe(config: TrainingConfig, workdir: Path, *, sigterm_after_step: int | None = None) -> RecipeRun:
    return run_subprocess(config, workdir, sigterm_after_step=sigterm_after_step, timeout_s=600)


# --------------------------------------------------------------------------- tests

TOTAL_STEPS = 30  # 40 rows / batch 4 = 10 steps per epoch, 3 epochs
HYPERPARAMETERS = {
    "n_epochs": 3, "learning_rate": 1e-2, "batch_size": 4, "gradient_accumulation_steps": 1,
    "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "max_seq_len": 256, "seed": 0,
    "checkpoint_every_steps": 10, "warmup_ratio": 0.05,
}
CHECKPOINT_FILES = ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")


def make_config(job_id, base, data_files, output_dir: Path, hyperparameters=None, **overrides) -> TrainingConfig:
    return TrainingConfig(**{"job_id": job_id, "base_model": str(base), "train_file": data_files["train"],
                             "output_dir": output_dir, "method": "lora",
                             "hyperparameters": {**HYPERPARAMETERS, **(hyperparameters or {})}, **overrides})


@pytest.fixture(scope="module")
def full_run(tiny_base, data_files, tmp_path_factory):
    work = tmp_path_factory.mktemp("full")
    config = make_config("job-full", tiny_base, data_files, work / "out", validation_file=data_files["holdout"])
    return run_recipe(config, work)


def assert_stdout_protocol(run):
    # the harness parsed every stdout line as an event; logs must have gone to stderr instead
    for event in run.events:
        assert event.job_id == "job-full" and event.time is not None
    assert run.stderr.strip()
    assert '"event"' not in run.stderr


def test_events_in_order_and_final_adapter_beats_base(full_run, tiny_base, data_files):
    from peft import PeftModel
    from whetstone.modelkit.holdout import holdout_loss
    from whetstone.modelkit.loading import load_model, load_tokenizer

    run = full_run
    assert run.returncode == 0, run.stderr[-3000:]
    assert_stdout_protocol(run)
    assert run.names()[0] == "started" and run.names()[-2:] == ["checkpoint", "completed"]
    started = run.of(Started)[0]
    assert started.total_steps == TOTAL_STEPS and started.resumed_from_step == 0

    progress = run.of(Progress)
    assert [e.step for e in progress] == list(range(1, TOTAL_STEPS + 1))
    for event in progress:
        assert event.total_steps == TOTAL_STEPS
        for key in ("epoch", "loss", "grad_norm", "learning_rate", "tokens_per_s", "samples_per_s"):
            assert isinstance(getattr(event, key), (int, float)), key
        assert event.step_time_s > 0 and event.mfu is None  # CPU: no peak FLOP/s, no MFU
    assert progress[-1].epoch == pytest.approx(3.0)

    checkpoints = run.of(Checkpoint)
    assert [(c.kind, c.step) for c in checkpoints] == [("periodic", 10), ("periodic", 20), ("final", 30)]
    for checkpoint in checkpoints[:2]:
        path = checkpoint.path
        assert path.is_absolute()
        assert all((path / name).is_file() for name in CHECKPOINT_FILES)
        # the event comes after the progress event of the same step
        assert run.events.index(checkpoint) > run.events.index(progress[checkpoint.step - 1])

    final = checkpoints[-1].path
    assert final.name == "final"
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "chat_template.jinja"):
        assert (final / name).is_file(), name
    assert not (final / "training_args.bin").exists()

    completed = run.completed
    assert completed.step == TOTAL_STEPS and completed.tokens > 0 and completed.runtime_s > 0
    assert completed.train_loss < progress[0].loss

    tokenizer = load_tokenizer(tiny_base)
    rows = read_rows(data_files["holdout"])
    base_loss = holdout_loss(load_model(tiny_base, dtype="float32"), tokenizer, rows)["loss"]
    adapted = PeftModel.from_pretrained(load_model(tiny_base, dtype="float32"), final)
    adapter_loss = holdout_loss(adapted, tokenizer, rows)["loss"]
    assert adapter_loss < base_loss - 1.0, (base_loss, adapter_loss)
    assert completed.validation.loss == pytest.approx(adapter_loss, rel=1e-4)


def test_resume_from_periodic_checkpoint_reproduces_the_loss_curve(full_run, tiny_base, data_files, tmp_path):
    checkpoint = next(c for c in full_run.of(Checkpoint) if c.step == 10)
    config = make_config("job-resume", tiny_base, data_files, tmp_path / "out", resume_from=checkpoint.path)
    run = run_recipe(config, tmp_path)

    assert run.returncode == 0, run.stderr[-3000:]
    started = run.events[0]
    assert isinstance(started, Started) and (started.total_steps, started.resumed_from_step) == (TOTAL_STEPS, 10)
    resumed, reference = run.losses(), full_run.losses()
    assert sorted(resumed) == list(range(11, TOTAL_STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=1e-5), step
    assert run.completed.step == TOTAL_STEPS


def test_sigterm_writes_emergency_checkpoint_and_resume_completes(full_run, tiny_base, data_files, tmp_path):
    config = make_config("job-preempt", tiny_base, data_files, tmp_path / "out",
                         hyperparameters={"checkpoint_every_steps": 0})  # only the emergency checkpoint
    run = run_recipe(config, tmp_path / "first", sigterm_after_step=3)

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.names()[-2:] == ["checkpoint", "preempted"]
    assert "completed" not in run.names()
    emergency, preempted = run.events[-2], run.events[-1]
    assert isinstance(emergency, Checkpoint) and isinstance(preempted, Preempted)
    step = emergency.step
    assert emergency.kind == "emergency" and 3 <= step < TOTAL_STEPS
    assert preempted.step == step and preempted.checkpoint == emergency.path
    assert run.of(Progress)[-1].step == step  # stopped right after the step in flight
    path = emergency.path
    assert all((path / name).is_file() for name in CHECKPOINT_FILES)
    assert json.loads((path / "trainer_state.json").read_text())["global_step"] == step

    resumed = run_recipe(config.model_copy(update={"job_id": "job-preempt-2", "resume_from": path}),
                         tmp_path / "second")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.of(Started)[0].resumed_from_step == step
    assert [e.step for e in resumed.of(Progress)] == list(range(step + 1, TOTAL_STEPS + 1))
    assert resumed.names()[-2:] == ["checkpoint", "completed"]
    assert resumed.completed.step == TOTAL_STEPS
    reference = full_run.losses()
    for s, loss in {**run.losses(), **resumed.losses()}.items():
        assert loss == pytest.approx(reference[s], abs=1e-5), s


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', "{not json"],
         "line 2: invalid JSON"),
        (['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', "",
          '{"messages": [{"role": "robot", "content": "hi"}]}'], "line 3: message 0 has role 'robot'"),
        (['{"messages": [{"role": "user", "content": "only a question"}]}'], "line 1: no trained message"),
    ],
)
def test_bad_training_data_fails_as_user_error_with_line_number(tiny_base, data_files, tmp_path, lines, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    config = make_config("job-bad", tiny_base, {**data_files, "train": bad}, tmp_path / "out")
    run = run_recipe(config, tmp_path)

    assert run.returncode == 1
    failed, = run.of(Failed)
    assert run.names() == ["failed"] and failed.error_class == "user"
    assert needle in failed.message


def test_missing_base_model_fails_as_platform_error(data_files, tmp_path):
    config = make_config("job-nobase", tmp_path / "missing-model", data_files, tmp_path / "out")
    run = run_recipe(config, tmp_path)

    assert run.returncode == 1
    failed, = run.of(Failed)
    assert run.names() == ["failed"] and failed.error_class == "platform"
    assert "missing-model" in failed.message and "does not exist" in failed.message


def test_invalid_hyperparameters_fail_as_user_error(tiny_base, data_files, tmp_path):
    config = make_config("job-hp", tiny_base, data_files, tmp_path / "out", hyperparameters={"lora_r": 0})
    run = run_recipe(config, tmp_path)

    assert run.returncode == 1
    failed, = run.of(Failed)
    assert run.names() == ["failed"] and failed.error_class == "user"
    assert "lora_r=0" in failed.message
