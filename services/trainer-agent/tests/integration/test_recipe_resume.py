"""Preemption and resume, bit for bit (real child processes, CPU, tiny Llama).

One job is interrupted by SIGTERM at 5 random training forward passes - mid-epoch, at an
epoch boundary and between gradient-accumulation micro-steps - and resumed each time from
its emergency checkpoint. Its per-step losses and final adapter must equal those of the
uninterrupted run exactly (==, torch.equal), and every emergency checkpoint must hold the
step that was in flight, finished."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from whetstone.devstack.recipe_harness import interrupted_chain
from whetstone.trainer_agent.domain.recipe_io import Checkpoint, TrainingConfig

pytestmark = pytest.mark.integration

ACCUMULATION = 2
STEPS_PER_EPOCH = 10  # 40 rows / micro-batch 2 / accumulation 2
HYPERPARAMETERS = {"n_epochs": 2, "learning_rate": 5e-3, "batch_size": 2, "gradient_accumulation_steps": ACCUMULATION,
                   "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "max_seq_len": 256, "seed": 7,
                   "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0, "warmup_ratio": 0.1}


def interruption_points(seed: int = 20261122) -> list[int]:
    """5 forward passes: one at the epoch boundary, two between micro-steps, two anywhere."""
    rng = random.Random(seed)
    total = 2 * STEPS_PER_EPOCH * ACCUMULATION
    boundary = STEPS_PER_EPOCH * ACCUMULATION  # last micro-step of epoch 1
    points = {boundary}
    while len(points) < 3:
        points.add(rng.randrange(1, total - 2, 2))  # odd: after the first micro-step of a step
    while len(points) < 5:
        candidate = rng.randrange(1, total - 2)
        if all(-(-candidate // ACCUMULATION) != -(-p // ACCUMULATION) for p in points):
            points.add(candidate)
    return sorted(points)


def test_interrupted_five_times_equals_uninterrupted_bit_for_bit(tiny_base, data_files, tmp_path):
    points = interruption_points()
    assert any(p % ACCUMULATION for p in points) and STEPS_PER_EPOCH * ACCUMULATION in points
    config = TrainingConfig(job_id="job-chain", base_model=str(tiny_base), train_file=data_files["train"],
                            output_dir=tmp_path / "unused", method="lora", hyperparameters=HYPERPARAMETERS)
    chain = interrupted_chain(config, tmp_path, points, ACCUMULATION)

    assert chain.reference.returncode == 0, chain.reference.stderr[-2000:]
    assert len(chain.segments) == 6
    for segment in chain.segments[:-1]:
        assert segment.returncode == 0, segment.stderr[-2000:]
        assert segment.names()[-2:] == ["checkpoint", "preempted"]
        emergency = segment.of(Checkpoint)[-1]
        assert emergency.kind == "emergency"
        path = Path(emergency.path)
        state = json.loads((path / "whetstone_state.json").read_text())
        assert state["kind"] == "emergency" and state["data_position"]["micro_batches_into_epoch"] % ACCUMULATION == 0
        assert segment.last.sigterm_to_checkpoint_s >= 0
    # SIGTERM between micro-steps finished the optimizer step in flight first
    assert chain.emergency_steps == [-(-p // ACCUMULATION) for p in points]
    assert chain.segments[-1].last.event == "completed"
    assert chain.segments[-1].events[0].resumed_from_step == chain.emergency_steps[-1]

    reference = chain.reference.losses()
    assert sorted(reference) == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert chain.chained_losses() == reference  # every step's loss, exactly
    assert chain.exact()  # ... and the final adapter weights, torch.equal
