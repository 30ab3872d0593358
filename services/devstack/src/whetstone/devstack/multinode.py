"""Loss parity of a multi-node (gang) job, for the multi-node test and `make bench-multinode`.

The reference is ONE plain recipe process (`recipe_harness.run_subprocess`, as the agent runs a
single-device segment) on the same data, seed and hyperparameters, its micro-batch the gang's
effective batch (nodes x the gang's per-rank batch). DDP keeps the gang's data order (the seeded
sampler's permutation does not depend on the world size; rank r takes the r-th micro-batch of each
global batch), averages the ranks' gradients, and the Trainer logs the mean of the ranks' losses: the
two curves are the same computation, reduced in a different order. Only without dropout
(`lora_dropout` 0): each rank draws its own dropout masks, which one process cannot repeat (the
platform's default 0.05 put the curves 1.7e-2 apart by the fourth step).

`LOSS_TOLERANCE`: fp32 sums of the same terms in another order differ by a few ulp (about 1e-7
relative); a few Adam steps on a tiny model carry that through without amplifying it much (measured
1.2e-7 over 8 steps on this machine). 1e-4 leaves three orders of margin for that and still catches
a real divergence: a gang that skipped the all-reduce, or split the batch differently, is off by
1e-2 or more from the second step on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from whetstone.trainer_agent.domain.recipe_io import Progress

from .recipe_harness import run_subprocess

LOSS_TOLERANCE = 1e-4


def max_rel_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest |a_i - b_i| / |b_i| over the steps both curves have; inf when their lengths differ."""
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


async def reference_losses(base_model: Path, train_file: Path, hyperparameters: Mapping[str, Any],
                           workdir: Path, timeout_s: float = 600) -> list[float]:
    """The per-step losses of one plain recipe process (LoRA SFT) on `train_file`."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"job_id": "reference", "base_model": str(base_model), "train_file": str(train_file),
              "output_dir": str(workdir / "out"), "method": "lora", "hyperparameters": dict(hyperparameters)}
    run = await asyncio.to_thread(run_subprocess, config, workdir, timeout_s=timeout_s)
    if run.returncode != 0:
        raise RuntimeError(f"reference run failed ({run.returncode}): {run.stderr[-2000:]}")
    return [p.loss for p in run.of(Progress) if p.loss is not None]
