"""The LoRA SFT recipe as a real child process on the tiny Llama (CPU, ~10 s per run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RECIPE_MODULE = "whetstone.trainer_agent.recipes.main"


# --------------------------------------------------------------------------- runner: as the trainer agent does


@dataclass
class RecipeRun:
    returncode: int
    events: list[dict] = field(default_factory=list)
    stderr: str = ""

    def of(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]

    def names(self) -> list[str]:
        return [e["event"] for e in self.events]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("progress")}


def read_rows(path: Path) -> list[list[dict]]:
    """The `messages` of every row of a chat JSONL file."""
    return [json.loads(line)["messages"] for line in path.read_text().splitlines() if line.strip()]


def run_recipe(config: dict, workdir: Path, *, sigterm_after_step: int | None = None,
               timeout_s: float = 120) -> RecipeRun:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / f"{config['job_id']}.config.json"
    config_path.write_text(json.dumps(config))
    stderr_path = workdir / f"{config['job_id']}.stderr.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", RECIPE_MODULE, "--config", str(config_path)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
        )
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        events, signalled = [], False
        try:
            for line in proc.stdout:
                events.append(json.loads(line))  # stdout must carry nothing but JSON events
                event = events[-1]
                if (sigterm_after_step is not None and not signalled and event["event"] == "progress"
                        and event["step"] >= sigterm_after_step):
                    proc.send_signal(signal.SIGTERM)
                    signalled = True
            returncode = proc.wait()
        finally:
            watchdog.cancel()
    return RecipeRun(returncode=returncode, events=events, stderr=stderr_path.read_text())


# --------------------------------------------------------------------------- tests

TOTAL_STEPS = 30  # 40 rows / batch 4 = 10 steps per epoch, 3 epochs
HYPERPARAMETERS = {
    "n_epochs": 3, "learning_rate": 1e-2, "batch_size": 4, "gradient_accumulation_steps": 1,
    "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "max_seq_len": 256, "seed": 0,
    "checkpoint_every_steps": 10, "warmup_ratio": 0.05,
}
CHECKPOINT_FILES = ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")


def make_config(job_id, base, data_files, output_dir: Path, **overrides) -> dict:
    config = {
        "job_id": job_id, "base_model": str(base), "train_file": str(data_files["train"]),
        "output_dir": str(output_dir), "method": "lora", "hyperparameters": dict(HYPERPARAMETERS),
    }
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def full_run(tiny_base, data_files, tmp_path_factory):
    work = tmp_path_factory.mktemp("full")
    config = make_config("job-full", tiny_base, data_files, work / "out", validation_file=str(data_files["holdout"]))
    return run_recipe(config, work)


def assert_stdout_protocol(run):
    # run_recipe already json-parsed every stdout line; logs must have gone to stderr instead
    for event in run.events:
        assert {"event", "job_id", "time"} <= set(event)
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
    assert run.events[0]["total_steps"] == TOTAL_STEPS and run.events[0]["resumed_from_step"] == 0

    progress = run.of("progress")
    assert [e["step"] for e in progress] == list(range(1, TOTAL_STEPS + 1))
    for event in progress:
        assert event["total_steps"] == TOTAL_STEPS
        for key in ("epoch", "loss", "grad_norm", "learning_rate", "tokens_per_s", "samples_per_s"):
            assert isinstance(event[key], (int, float)), key
        assert event["step_time_s"] > 0 and event["mfu"] is None  # CPU: no peak FLOP/s, no MFU
    assert progress[-1]["epoch"] == pytest.approx(3.0)

    checkpoints = run.of("checkpoint")
    assert [(c["kind"], c["step"]) for c in checkpoints] == [("periodic", 10), ("periodic", 20), ("final", 30)]
    for checkpoint in checkpoints[:2]:
        path = Path(checkpoint["path"])
        assert path.is_absolute()
        assert all((path / name).is_file() for name in CHECKPOINT_FILES)
        # the event comes after the progress event of the same step
        assert run.events.index(checkpoint) > run.events.index(progress[checkpoint["step"] - 1])

    final = Path(checkpoints[-1]["path"])
    assert final.name == "final"
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "chat_template.jinja"):
        assert (final / name).is_file(), name
    assert not (final / "training_args.bin").exists()

    completed = run.events[-1]
    assert completed["step"] == TOTAL_STEPS and completed["tokens"] > 0 and completed["runtime_s"] > 0
    assert completed["train_loss"] < progress[0]["loss"]

    tokenizer = load_tokenizer(tiny_base)
    rows = read_rows(data_files["holdout"])
    base_loss = holdout_loss(load_model(tiny_base, dtype="float32"), tokenizer, rows)["loss"]
    adapted = PeftModel.from_pretrained(load_model(tiny_base, dtype="float32"), final)
    adapter_loss = holdout_loss(adapted, tokenizer, rows)["loss"]
    assert adapter_loss < base_loss - 1.0, (base_loss, adapter_loss)
    assert completed["validation_loss"] == pytest.approx(adapter_loss, rel=1e-4)


def test_resume_from_periodic_checkpoint_reproduces_the_loss_curve(full_run, tiny_base, data_files, tmp_path):
    checkpoint = next(c for c in full_run.of("checkpoint") if c["step"] == 10)
    config = make_config("job-resume", tiny_base, data_files, tmp_path / "out", resume_from=checkpoint["path"])
    run = run_recipe(config, tmp_path)

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.events[0] == {**run.events[0], "event": "started", "total_steps": TOTAL_STEPS, "resumed_from_step": 10}
    resumed, reference = run.losses(), full_run.losses()
    assert sorted(resumed) == list(range(11, TOTAL_STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference[step], abs=1e-5), step
    assert run.events[-1]["event"] == "completed" and run.events[-1]["step"] == TOTAL_STEPS


def test_sigterm_writes_emergency_checkpoint_and_resume_completes(full_run, tiny_base, data_files, tmp_path):
    config = make_config("job-preempt", tiny_base, data_files, tmp_path / "out")
    config["hyperparameters"]["checkpoint_every_steps"] = 0  # only the emergency checkpoint
    run = run_recipe(config, tmp_path / "first", sigterm_after_step=3)

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.names()[-2:] == ["checkpoint", "preempted"]
    assert "completed" not in run.names()
    emergency, preempted = run.events[-2], run.events[-1]
    step = emergency["step"]
    assert emergency["kind"] == "emergency" and 3 <= step < TOTAL_STEPS
    assert preempted["step"] == step and preempted["checkpoint"] == emergency["path"]
    assert run.of("progress")[-1]["step"] == step  # stopped right after the step in flight
    path = Path(emergency["path"])
    assert all((path / name).is_file() for name in CHECKPOINT_FILES)
    assert json.loads((path / "trainer_state.json").read_text())["global_step"] == step

    resumed = run_recipe({**config, "job_id": "job-preempt-2", "resume_from": str(path)}, tmp_path / "second")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.events[0]["resumed_from_step"] == step
    assert [e["step"] for e in resumed.of("progress")] == list(range(step + 1, TOTAL_STEPS + 1))
    assert resumed.names()[-2:] == ["checkpoint", "completed"]
    assert resumed.events[-1]["step"] == TOTAL_STEPS
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
    assert run.names() == ["failed"]
    assert run.events[0]["error_class"] == "user"
    assert needle in run.events[0]["message"]


def test_missing_base_model_fails_as_platform_error(data_files, tmp_path):
    config = make_config("job-nobase", tmp_path / "missing-model", data_files, tmp_path / "out")
    run = run_recipe(config, tmp_path)

    assert run.returncode == 1
    assert run.names() == ["failed"]
    assert run.events[0]["error_class"] == "platform"
    assert "missing-model" in run.events[0]["message"] and "does not exist" in run.events[0]["message"]


def test_invalid_hyperparameters_fail_as_user_error(tiny_base, data_files, tmp_path):
    config = make_config("job-hp", tiny_base, data_files, tmp_path / "out")
    config["hyperparameters"]["lora_r"] = 0
    run = run_recipe(config, tmp_path)

    assert run.returncode == 1
    assert run.events == [{**run.events[0], "event": "failed", "error_class": "user"}]
    assert "lora_r=0" in run.events[0]["message"]
