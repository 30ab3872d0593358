"""What the agent reports about its training processes and its capacity. Pure."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from whetstone.contracts import JobProgressV1
from whetstone.contracts.enums import ErrorClass, PreemptionReason

from .recipe_io import Progress
from .runs import RunOutcome

LOG_TAIL_CHARS = 2000


@dataclass(frozen=True)
class ExitReport:
    """The event a training process's end calls for when it sent no terminal event itself."""

    outcome: Literal[RunOutcome.FAILED, RunOutcome.PREEMPTED, RunOutcome.WORKER_DONE]
    error_class: ErrorClass | None = None
    code: str | None = None
    message: str | None = None
    reason: PreemptionReason | None = None


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def classify_exit(returncode: int | None, *, cancelled: bool, stopping: PreemptionReason | None, worker_node: bool,
                  log_tail: str, stop_requested: bool = False) -> ExitReport:
    """A process that ended without `completed` / `failed` / `preempted`:
    cancelled by the user -> failed (user, cancelled), so metering closes the segment;
    a non-zero-rank node of a gang that was asked to stop (its agent draining, or a preempt request,
    `stop_requested`) -> nothing to say, whatever its launcher's exit status (torchrun exits non-zero
    on SIGTERM): its SIGTERM stopped every rank after the same step (`any_rank`), and rank 0 writes
    the gang's one emergency checkpoint and reports job.preempted with it. A report from this node
    could reach the scheduler first and re-queue the gang from an older checkpoint;
    stopped by the agent (drain, spot loss) -> preempted from the last durable checkpoint;
    a non-zero-rank node's launcher that ended cleanly -> nothing to say (rank 0 reports);
    anything else is a crash -> failed (platform) with the log tail. Never silent."""
    if cancelled:
        return ExitReport(RunOutcome.FAILED, ErrorClass.USER, "cancelled", "cancelled by user")
    if worker_node and (stopping or stop_requested):
        return ExitReport(RunOutcome.WORKER_DONE)
    if stopping:
        return ExitReport(RunOutcome.PREEMPTED, reason=stopping)
    if worker_node and returncode == 0:
        return ExitReport(RunOutcome.WORKER_DONE)
    tail = log_tail[-LOG_TAIL_CHARS:].strip()
    return ExitReport(RunOutcome.FAILED, ErrorClass.PLATFORM, "trainer_crashed",
                      f"training process {describe_exit(returncode)} without reporting a result"
                      + (f"; log tail:\n{tail}" if tail else "; it wrote no log"))


# what a rank's error says when the collective's other side went away or stopped answering (gloo, NCCL,
# torch's TCP store): a node of the gang was lost, not a fault of this node or of the job
PEER_LOST_SIGNS = ("connection closed by peer", "connection reset by peer", "broken pipe", "distnetworkerror",
                   "distbackenderror", "timed out waiting", "watchdog caught collective operation timeout",
                   "nccl communicator was aborted", "socket timeout", "connection refused",
                   "waiting for clients", "rendezvoustimeouterror")   # the other nodes never joined


def gang_peer_lost(nodes: int, error_class: ErrorClass | None, message: str) -> bool:
    """A multi-node segment's platform failure that is another node vanishing or hanging (its rank's
    collective broke or timed out): the segment is preempted (node_lost) from its last durable
    checkpoint, and the scheduler re-queues the gang, instead of the job failing."""
    text = message.lower()
    return nodes > 1 and error_class in (ErrorClass.PLATFORM, None) and any(s in text for s in PEER_LOST_SIGNS)


def preempt_reason(stopping: PreemptionReason | None, reported: str | None) -> PreemptionReason:
    """Why a segment stopped: the agent's own reason wins (it sent the signal), else the recipe's."""
    if stopping is not None:
        return stopping
    return PreemptionReason(reported) if reported in set(PreemptionReason) else PreemptionReason.SIGNAL


def stop_reason(spot: bool) -> PreemptionReason:
    """The agent is being stopped (SIGTERM to the agent): a spot node is being reclaimed, any
    other node is being drained."""
    return PreemptionReason.SPOT_LOSS if spot else PreemptionReason.DRAIN


def free_gpu_ids(gpu_count: int, held: Iterable[Iterable[int]], draining: bool) -> list[int]:
    """GPU slots the scheduler may place on: none while draining, else those no segment holds."""
    if draining:
        return []
    busy = {g for ids in held for g in ids}
    return [g for g in range(gpu_count) if g not in busy]


# ------------------------------------------------------------------ the recipe's events -> ours


def job_progress(p: Progress, *, job_id: str, segment_id: str, attempt: int) -> JobProgressV1:
    """A recipe `progress` event as job.progress; the trainer logs its token accuracy as
    `mean_token_accuracy`."""
    return JobProgressV1(
        job_id=job_id, segment_id=segment_id, attempt=attempt, step=p.step, total_steps=p.total_steps, epoch=p.epoch,
        loss=p.loss, grad_norm=p.grad_norm, learning_rate=p.learning_rate, tokens_per_s=p.tokens_per_s,
        samples_per_s=p.samples_per_s, peak_memory_mb=p.peak_memory_mb,
        validation_loss=p.validation.loss if p.validation else None, tokens_seen=p.tokens_seen,
        token_accuracy=p.mean_token_accuracy, gpu_utilization=p.gpu_utilization, step_time_s=p.step_time_s,
        mfu=p.mfu)


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

    def due(self, p: Progress) -> bool:
        step_time = p.step_time_s if p.step_time_s is not None and p.step_time_s > 0 else None
        if self.reported == 0:
            due = True
        elif self.stride is None:
            self.stride = max(1, math.ceil(self.interval_s / step_time)) if step_time else 1
            due = True
        else:
            while step_time and step_time * self.stride * 4 < self.interval_s:
                self.stride *= 2
            due = p.step % self.stride == 0 or p.step == p.total_steps
        self.reported += due
        return due
