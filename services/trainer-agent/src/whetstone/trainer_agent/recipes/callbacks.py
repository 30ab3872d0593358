"""The platform's TrainerCallback: progress events, checkpoint cadence, SIGTERM, loss guard."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError
from .metrics import gpu_utilization, peak_memory_mb
from .protocol import EventStream, PreemptionFlag

log = logging.getLogger("whetstone.trainer_agent.recipes")

CHECKPOINT_STATE_FILE = "whetstone_state.json"


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
    progress: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Cadence:
    every_steps: int
    every_minutes: float

    def due(self, step: int, seconds_since_last: float) -> bool:
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        by_time = self.every_minutes > 0 and seconds_since_last >= self.every_minutes * 60
        return by_steps or by_time


def platform_callback(events: EventStream, preemption: PreemptionFlag, run: RunState, cadence: Cadence,
                      guard: DivergenceGuard, learning_rate: float,
                      validate: Callable[[Any], dict[str, float]] | None,
                      describe: Callable[[Any], dict[str, Any]]):
    """A TrainerCallback bound to this run (transformers is imported lazily)."""
    from transformers import TrainerCallback

    class PlatformCallback(TrainerCallback):
        def __init__(self) -> None:
            self._stopping = False
            self._last = (time.perf_counter(), 0, 0)  # time, tokens seen, global step
            self._last_save = time.monotonic()
            self._validation: dict[int, dict[str, float]] = {}

        def on_train_begin(self, args, state, control, **kwargs):
            self._last = (time.perf_counter(), state.num_input_tokens_seen, state.global_step)
            self._last_save = time.monotonic()
            for entry in state.log_history:  # a resumed run keeps its running minimum
                if "loss" in entry and entry["loss"] is not None and math.isfinite(entry["loss"]):
                    guard.best = min(guard.best, entry["loss"])
            if not run.announced:
                run.announced = True
                events.emit("started", total_steps=state.max_steps, resumed_from_step=state.global_step,
                            micro_batch_size=args.per_device_train_batch_size,
                            gradient_accumulation_steps=args.gradient_accumulation_steps)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step >= state.max_steps:
                return control  # the final artifact follows
            if preemption.requested:
                self._stopping = True
                control.should_save = True
                control.should_training_stop = True
            elif cadence.due(state.global_step, time.monotonic() - self._last_save):
                control.should_save = True
                if validate is not None:
                    started = time.perf_counter()
                    self._validation[state.global_step] = validate(model)
                    run.validation_seconds += time.perf_counter() - started
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            step = state.global_step
            reason = guard.check(step, logs["loss"])
            self._emit_progress(args, state, logs)
            if reason is not None:
                raise UserError(reason, code="loss_diverged", advice=divergence_advice(learning_rate))

        def _emit_progress(self, args, state, logs) -> None:
            now, tokens, step = time.perf_counter(), state.num_input_tokens_seen, state.global_step
            last_time, last_tokens, last_step = self._last
            elapsed = max(now - last_time, 1e-9)
            samples = (step - last_step) * args.per_device_train_batch_size * args.gradient_accumulation_steps
            samples *= max(args.world_size, 1)
            self._last = (now, tokens, step)
            progress = {
                "step": step,
                "total_steps": state.max_steps,
                "epoch": round(state.epoch or 0.0, 4),
                "loss": logs["loss"],
                "grad_norm": logs.get("grad_norm"),
                "learning_rate": logs.get("learning_rate"),
                "tokens_per_s": round((tokens - last_tokens) / elapsed, 1),
                "samples_per_s": round(samples / elapsed, 2),
                "tokens_seen": tokens,
                "peak_memory_mb": peak_memory_mb(),
            }
            for key in ("mean_token_accuracy", "rewards/accuracies", "rewards/margins", "nll_loss"):
                if key in logs:
                    progress[key.replace("/", "_")] = logs[key]
            utilization = gpu_utilization()
            if utilization is not None:
                progress["gpu_utilization"] = utilization
            progress.update(self._validation.get(step, {}))
            run.progress.append(progress)
            events.emit("progress", **progress)

        def on_save(self, args, state, control, **kwargs):
            path = Path(args.output_dir, f"checkpoint-{state.global_step}").resolve()
            kind = "emergency" if self._stopping else "periodic"
            info = {"kind": kind, **describe(state)}
            (path / CHECKPOINT_STATE_FILE).write_text(json.dumps(info, indent=1) + "\n")
            self._last_save = time.monotonic()
            if self._stopping:
                run.emergency_checkpoint = path
            else:
                run.last_checkpoint = path
            events.emit("checkpoint", kind=kind, step=state.global_step, path=str(path),
                        **self._validation.pop(state.global_step, {}))

    return PlatformCallback()
