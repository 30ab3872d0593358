"""A gang run of the SFT recipe (two processes, DDP over gloo on CPU) against one process with the gang's
effective batch, on a file whose rows do not fill the last global step: every step's loss is the same,
the last included (the blank examples of recipes/gang_order.py, instead of Accelerate's repeated ones)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from whetstone.devstack.multinode import LOSS_TOLERANCE, max_rel_diff
from whetstone.devstack.recipe_harness import RECIPE_MODULE, parse_line, write_config
from whetstone.trainer_agent.domain.recipe_io import Completed, Progress, TrainingConfig

pytestmark = pytest.mark.integration

ROWS = 10        # 2 ranks x 2 per rank = 4 a step: 3 steps, the last one with 2 rows
HYPERPARAMETERS = {"n_epochs": 1, "max_seq_len": 48, "lora_r": 4, "lora_alpha": 8, "seed": 0, "learning_rate": 4e-3,
                   "checkpoint_every_steps": 1000, "lora_dropout": 0.0, "gradient_accumulation_steps": 1}


def _launch(base: Path, train: Path, work: Path, job: str, batch: int, env: dict[str, str]) -> subprocess.Popen:
    config = TrainingConfig(job_id=job, base_model=str(base), train_file=train, output_dir=work / job,
                            method="lora", hyperparameters={**HYPERPARAMETERS, "batch_size": batch})
    path = write_config(config, work / job)
    stderr = (work / f"{job}.{env.get('RANK', 'single')}.stderr.txt").open("w")
    return subprocess.Popen([sys.executable, "-m", RECIPE_MODULE, "--config", str(path)], stdout=subprocess.PIPE,
                            stderr=stderr, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                 "OMP_NUM_THREADS": "1", **env})


def _losses(proc: subprocess.Popen, into: dict[int, float], ended: list) -> None:
    for line in proc.stdout:
        event = parse_line(line)
        if isinstance(event, Progress) and event.loss is not None:
            into[event.step] = event.loss
        ended.append(event)
    proc.wait(timeout=300)


def test_a_two_rank_run_has_the_one_process_loss_at_every_step_the_short_last_one_included(tiny_base, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                                                      {"role": "assistant", "content": f"It is {i + 1}."}]}) + "\n"
                             for i in range(ROWS)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                  "LOCAL_RANK": "0"}
    procs = [_launch(tiny_base, train, tmp_path, "gang", 2, {**rendezvous, "RANK": str(r), "GROUP_RANK": str(r)})
             for r in (0, 1)] + [_launch(tiny_base, train, tmp_path, "single", 4, {})]
    losses: list[dict[int, float]] = [{}, {}, {}]
    events: list[list] = [[], [], []]
    readers = [threading.Thread(target=_losses, args=(p, losses[i], events[i])) for i, p in enumerate(procs)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(timeout=400)
    assert [p.returncode for p in procs] == [0, 0, 0], [(tmp_path / f).read_text()[-2000:] for f in
                                                         ("gang.0.stderr.txt", "gang.1.stderr.txt")]
    gang, single = losses[0], losses[2]
    assert isinstance(events[0][-1], Completed) and isinstance(events[2][-1], Completed)
    assert sorted(gang) == sorted(single) == [1, 2, 3], (gang, single)
    assert max_rel_diff([gang[s] for s in (1, 2, 3)], [single[s] for s in (1, 2, 3)]) <= LOSS_TOLERANCE, (gang, single)
