"""The platform's training monitor: progress events, checkpoint cadence, SIGTERM, loss guard."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whetstone.contracts.enums import CheckpointKind

from ..domain.recipe_io import Checkpoint, Progress, Started, Validation
from .checkpointing import CheckpointState, write_checkpoint_state
from .errors import UserError
from .hyperparams import Hyperparameters
from .metrics import ProgressMeter
from .protocol import EventStream, PreemptionFlag
from .validation import Validator

log = logging.getLogger("whetstone.trainer_agent.recipes")


class DivergenceGuard:
    """Stops a run whose loss is NaN/Inf, or stays far above its running minimum."""

    MIN_GAP = 1.0  # nats: a tiny loss doubling is noise, not divergence

    def __init__(self, factor: float, patience: int) -> None:
        self.factor = factor
        self.patience = patience
        self.best = math.inf
        self.strikes = 0

    def check(self, step: int, loss: float | None) -> str | None:
        """Why training must stop at this step, or None."""
        if loss is None or not math.isfinite(loss):
            return f"loss became {loss} at step {step}"
        if self.factor and loss > self.factor * self.best and loss - self.best > self.MIN_GAP:
            self.strikes += 1
            if self.strikes >= self.patience:
                return (f"loss diverged at step {step}: {loss:.4g}, more than {self.factor:g}x its running minimum "
                        f"{self.best:.4g} for {self.patience} steps")
        else:
            self.strikes = 0
        self.best = min(self.best, loss)
        return None


def divergence_advice(learning_rate: float) -> list[str]:
    return [
        f"lower learning_rate (e.g. {learning_rate / 10:.2g})",
        "raise warmup_ratio (e.g. 0.1)",
        "keep max_grad_norm at 1.0 or lower",
        "check the data for corrupt, duplicated or extremely long examples",
    ]


@dataclass
class RunState:
    """What outlives one Trainer (an OOM retry builds a new one)."""

    announced: bool = False
    last_checkpoint: Path | None = None
    emergency_checkpoint: Path | None = None
    checkpoint_seconds: float = 0.0
    validation_seconds: float = 0.0
    progress: list[Progress] = field(default_factory=list)


@dataclass
class Cadence:
    every_steps: int
    every_minutes: float

    def due(self, step: int, seconds_since_last: float) -> bool:
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        by_time = self.every_minutes > 0 and seconds_since_last >= self.every_minutes * 60
        return by_steps or by_time


Describer = Callable[[Any, str], CheckpointState]   # (trainer state, kind) -> whetstone_state.json


class TrainingMonitor:
    """What the platform does at each point of the HF training loop (`platform_callback` is its
    adapter): announce the run, stop after the step in flight on SIGTERM, checkpoint on cadence
    (validating first), report progress, stop a diverging run, mark each saved checkpoint.
    `validate_every`: also validate every that many steps between checkpoints (a reinforcement job's
    `eval_interval`); that figure rides on the step's progress event."""

    def __init__(self, events: EventStream, preemption: PreemptionFlag, run: RunState, hp: Hyperparameters,
                 validate: Validator | None, describe: Describer, validate_every: int | None = None) -> None:
        self.events, self.preemption, self.run = events, preemption, run
        self.validate_every = validate_every or 0
        self.cadence = Cadence(hp.checkpoint_every_steps, hp.checkpoint_every_minutes)
        self.guard = DivergenceGuard(hp.divergence_factor, hp.divergence_patience)
        self.learning_rate = hp.learning_rate
        self.validate, self.describe = validate, describe
        self.meter = ProgressMeter()
        self.stopping = False
        self.last_save = time.monotonic()
        self.validation: dict[int, Validation] = {}  # step -> metrics, reported with its checkpoint

    def train_begin(self, args, state, model=None) -> None:
        self.meter.start(state, model)
        self.last_save = time.monotonic()
        for entry in state.log_history:  # a resumed run keeps its running minimum
            if "loss" in entry and entry["loss"] is not None and math.isfinite(entry["loss"]):
                self.guard.best = min(self.guard.best, entry["loss"])
        if not self.run.announced:
            self.run.announced = True
            self.events.emit(Started(total_steps=state.max_steps, resumed_from_step=state.global_step,
                                     micro_batch_size=args.per_device_train_batch_size,
                                     gradient_accumulation_steps=args.gradient_accumulation_steps))

    def step_end(self, state, control, model) -> None:
        if state.global_step >= state.max_steps:
            return  # the final artifact follows
        if any_rank(self.preemption.requested):   # every rank of a gang stops after the same step
            self.stopping = True
            control.should_save = True
            control.should_training_stop = True
        elif self.cadence.due(state.global_step, time.monotonic() - self.last_save):
            control.should_save = True
            self._validate(state.global_step, model)
        elif self.validate_every and state.global_step % self.validate_every == 0:
            self._validate(state.global_step, model)

    def _validate(self, step: int, model) -> None:
        if self.validate is not None:
            started = time.perf_counter()
            self.validation[step] = self.validate(model)
            self.run.validation_seconds += time.perf_counter() - started

    def logged(self, args, state, logs) -> None:
        if not logs or "loss" not in logs:
            return
        reason = self.guard.check(state.global_step, logs["loss"])
        progress = self.meter.measure(args, state, logs)
        if state.global_step in self.validation:
            progress = progress.model_copy(update={"validation": self.validation[state.global_step]})
        self.run.progress.append(progress)
        self.events.emit(progress)
        if reason is not None:
            raise UserError(reason, code="loss_diverged", advice=divergence_advice(self.learning_rate))

    def saved(self, args, state) -> None:
        path = Path(args.output_dir, f"checkpoint-{state.global_step}").resolve()
        kind = CheckpointKind.EMERGENCY if self.stopping else CheckpointKind.PERIODIC
        write_checkpoint_state(path, self.describe(state, kind))
        self.last_save = time.monotonic()
        if self.stopping:
            self.run.emergency_checkpoint = path
        else:
            self.run.last_checkpoint = path
        self.events.emit(Checkpoint(kind=kind, step=state.global_step, path=path,
                                    validation=self.validation.pop(state.global_step, None)))


def any_rank(flag: bool) -> bool:
    """Whether `flag` is set on any rank of the job's process group (itself without one). Every rank
    calls it after the same optimizer step: a SIGTERM that reached one node's ranks stops them all
    there, so none waits in a collective for a rank that left to write the emergency checkpoint."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    agreed = torch.tensor([int(flag)], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return bool(agreed.item())


def platform_callback(monitor: TrainingMonitor):
    """The monitor as a transformers TrainerCallback (transformers is imported lazily)."""
    from transformers import TrainerCallback

    class PlatformCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            monitor.train_begin(args, state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            monitor.step_end(state, control, model)
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            monitor.logged(args, state, logs)

        def on_save(self, args, state, control, **kwargs):
            monitor.saved(args, state)

    return PlatformCallback()
