"""What the agent reports about its training processes and its capacity. Pure."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

PREEMPT_REASONS = ("spot_loss", "priority", "node_lost", "drain", "signal")
LOG_TAIL_CHARS = 2000


@dataclass(frozen=True)
class ExitReport:
    """The event a training process's end calls for when it sent no terminal event itself."""

    outcome: Literal["failed", "preempted", "worker_done"]
    error_class: str | None = None
    code: str | None = None
    message: str | None = None
    reason: str | None = None


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def classify_exit(returncode: int | None, *, cancelled: bool, stopping: str | None, worker_node: bool,
                  log_tail: str) -> ExitReport:
    """A process that ended without `completed` / `failed` / `preempted`:
    cancelled by the user -> failed (user, cancelled), so metering closes the segment;
    stopped by the agent (drain, spot loss) -> preempted from the last durable checkpoint;
    a non-zero-rank node's launcher that ended cleanly -> nothing to say (rank 0 reports);
    anything else is a crash -> failed (platform) with the log tail. Never silent."""
    if cancelled:
        return ExitReport("failed", "user", "cancelled", "cancelled by user")
    if stopping:
        return ExitReport("preempted", reason=stopping)
    if worker_node and returncode == 0:
        return ExitReport("worker_done")
    tail = log_tail[-LOG_TAIL_CHARS:].strip()
    return ExitReport("failed", "platform", "trainer_crashed",
                      f"training process {describe_exit(returncode)} without reporting a result"
                      + (f"; log tail:\n{tail}" if tail else "; it wrote no log"))


def failure_message(message: object, advice: object = None) -> str:
    """The recipe's message with its suggested changes (JobFailedV1 has no field of its own for them)."""
    text = str(message or "training failed")
    if isinstance(advice, list) and advice:
        text += " Suggested changes: " + "; ".join(map(str, advice)) + "."
    return text


def preempt_reason(stopping: str | None, reported: str | None) -> str:
    """Why a segment stopped: the agent's own reason wins (it sent the signal), else the recipe's."""
    if stopping in PREEMPT_REASONS:
        return stopping
    return reported if reported in PREEMPT_REASONS else "signal"


def stop_reason(spot: bool) -> str:
    """The agent is being stopped (SIGTERM to the agent): a spot node is being reclaimed, any
    other node is being drained."""
    return "spot_loss" if spot else "drain"


def free_gpu_ids(gpu_count: int, held: Iterable[Iterable[int]], draining: bool) -> list[int]:
    """GPU slots the scheduler may place on: none while draining, else those no segment holds."""
    if draining:
        return []
    busy = {g for ids in held for g in ids}
    return [g for g in range(gpu_count) if g not in busy]


# ------------------------------------------------------------------ the recipe's events -> ours

PROGRESS_FIELDS = ("step", "total_steps", "epoch", "loss", "grad_norm", "learning_rate", "tokens_per_s",
                   "samples_per_s", "peak_memory_mb", "validation_loss", "tokens_seen", "token_accuracy",
                   "gpu_utilization", "step_time_s", "mfu")
ENVELOPE_FIELDS = ("event", "job_id", "time")


# a checkpoint's own metrics: validation over the whole validation file at that step
CHECKPOINT_METRICS = ("validation_loss", "validation_mean_token_accuracy")


def progress_fields(msg: Mapping[str, Any]) -> dict[str, Any]:
    """job.progress fields from a recipe `progress` event (absent ones None); the trainer logs its
    token accuracy as `mean_token_accuracy`."""
    fields = {k: msg.get(k) for k in PROGRESS_FIELDS}
    if fields["token_accuracy"] is None:
        fields["token_accuracy"] = msg.get("mean_token_accuracy")
    return fields


@dataclass
class ProgressCadence:
    """Which recipe progress records (one per optimizer step) become job.progress: every `stride`-th
    step, so the loss arrives at a steady cadence in steps and a loss curve has evenly spaced points.
    The stride is fixed from the second record's measured step time (the first includes warm-up) to
    about one report per `interval_s`, and only ever doubles (keeping the points on the same grid)
    when steps get much faster. The first and the last step are always reported."""

    interval_s: float
    stride: int | None = None
    reported: int = 0

    def due(self, msg: Mapping[str, Any]) -> bool:
        step, total = msg.get("step"), msg.get("total_steps")
        if not isinstance(step, int):
            return False
        step_time = msg.get("step_time_s")
        timed = isinstance(step_time, (int, float)) and step_time > 0
        if self.reported == 0:
            due = True
        elif self.stride is None:
            self.stride = max(1, math.ceil(self.interval_s / step_time)) if timed else 1
            due = True
        else:
            while timed and step_time * self.stride * 4 < self.interval_s:
                self.stride *= 2
            due = step % self.stride == 0 or step == total
        self.reported += due
        return due


def completed_metrics(msg: Mapping[str, Any]) -> dict[str, Any]:
    """Every scalar of the recipe's `completed` event, as the job's metrics."""
    return {k: v for k, v in msg.items() if k not in ENVELOPE_FIELDS and isinstance(v, (int, float, str, bool))}


def reported_advice(msg: Mapping[str, Any]) -> list[str]:
    advice = msg.get("advice")
    return [str(a) for a in advice] if isinstance(advice, list) else []
