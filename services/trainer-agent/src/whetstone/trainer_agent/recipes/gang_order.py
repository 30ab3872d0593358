"""The data order of a gang (DDP) run, equal to one process's run with the gang's effective batch.

Accelerate gives rank r every world-th micro-batch of one seeded permutation, so a global step of a
gang holds the same examples as the one-process step with `world x micro x accumulation` examples.
When the epoch's examples do not fill the last global step, Accelerate evens the ranks out by
repeating examples from the start of the epoch: the gang's last step then trains on examples the
one-process run does not, and its loss differs (measured 1.3e-2 relative with 38 rows, 2 ranks of 2).

A gang run instead appends *blank* examples (one padding token, no target) to fill that step, and
orders them after the epoch's permutation of the real examples. A blank example adds no term to the
loss and no token to its normaliser (the Trainer counts target tokens across ranks), so every step,
the last included, computes what the one-process run computes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

IGNORE_INDEX = -100
BLANK_LINE = -1   # a blank example has no source line (a failing micro-batch never blames it)


def blanks_needed(examples: int, per_global_step: int) -> int:
    """How many blank examples fill the epoch's last global step (`per_global_step` examples a step)."""
    return -examples % per_global_step


def blank_example(pad_id: int) -> dict[str, Any]:
    return {"input_ids": [pad_id], "labels": [IGNORE_INDEX], "line": BLANK_LINE}


class GangOrder:
    """A sampler: the seeded permutation Accelerate's `SeedableRandomSampler` draws for `real` examples
    in this epoch (seed = initial seed + epoch), then the blank examples' indices `real..total-1`.

    Not a `RandomSampler`, so Accelerate keeps it instead of replacing it with its own."""

    def __init__(self, real: int, total: int, initial_seed: int) -> None:
        self.real, self.total, self.initial_seed = real, total, initial_seed
        self.epoch = 0

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[int]:
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.initial_seed + self.epoch)
        yield from torch.randperm(self.real, generator=generator).tolist()
        yield from range(self.real, self.total)
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
