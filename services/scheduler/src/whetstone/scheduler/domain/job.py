"""The job aggregate: one fine-tuning job and its state machine. Pure (no IO).

Every transition is a method that changes the job, notes what happened in the job's timeline
(`notes`, appended to the job's events when the store saves it) and returns the events to
publish. A transition the state machine does not allow changes nothing and returns no events
(redelivered or stale events are harmless). The job's rules live here: preemption counts,
re-queueing, which checkpoint to resume from, OFF-node fields."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from whetstone.contracts import (
    CheckpointRef, CostEstimate, EvalCompletedV1, Event, JobAssignedV1, JobCancelledV1, JobFailedV1,
    JobPreemptedV1, JobPreemptRequestedV1, JobQueuedV1, ModelMergedV1, NodeFencedV1, Resources, TrainingSpec,
)
from whetstone.contracts.enums import (
    CheckpointKind, ErrorClass, JobStatus, MergeStatus, PreemptionReason, PreemptRequestReason, SpecMethod, StageStatus,
)

from . import jobs as rules
from .job_data import (
    AssignedShape, JobError, JobRequest, JobResources, Note, PlacedPart, Progress, QuotaRecord, StoredCheckpoint,
)
from .placement import Shape, rendezvous

# OpenAI's statuses; the platform's finer state is kept beside them (`Job.status`)
PUBLIC_STATUS: dict[JobStatus, str] = {
    rules.VALIDATING: "validating_files", rules.QUEUED: "queued", rules.PREEMPTED: "queued",
    rules.PROVISIONING: "running", rules.RUNNING: "running", rules.CHECKPOINTING: "running",
    rules.EVALUATING: "running", rules.SUCCEEDED: "succeeded", rules.FAILED: "failed",
    rules.CANCELLED: "cancelled", rules.PAUSED: "paused",
}
SEGMENT_ATTEMPT = re.compile(r"-s(\d+)$")
MAX_TIMEOUT_REQUEUES = 3   # a job whose segments time out this often fails (platform) instead of looping


@dataclass
class Job:
    job_id: str
    tenant_id: str
    idempotency_key: str
    fingerprint: str
    request: JobRequest
    status: JobStatus
    tier: str
    created_at: datetime
    updated_at: datetime
    trace_id: str
    base_model: str                          # the base model admission resolved and pinned
    base_model_sha256: str
    priority: int = 1
    spec: TrainingSpec | None = None         # resolved once the training file is accepted (queued)
    resources: JobResources = field(default_factory=JobResources)
    node_id: str | None = None
    gpu_ids: list[int] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)
    placement: list[PlacedPart] = field(default_factory=list)
    segment_id: str | None = None
    attempt: int = 0
    latest_checkpoint: StoredCheckpoint | None = None
    progress: Progress = field(default_factory=Progress)
    error: JobError | None = None
    eval: EvalCompletedV1 | None = None      # the gate's verdict on the job's final checkpoint
    early_eval: EvalCompletedV1 | None = None  # a verdict that arrived before training reported completion
    trained_tokens: int | None = None
    queued_at: datetime | None = None
    queued_since: datetime | None = None     # start of the current queue period (queued or re-queued)
    waited_s: float = 0.0                    # queue wait of the earlier periods (the overdue guard's measure)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    sort_key: float | None = None
    estimated_runtime_s: float | None = None
    segment_started_at: datetime | None = None
    est_end_at: datetime | None = None
    last_checkpoint_at: datetime | None = None
    spot_preemptions: int = 0
    priority_preemptions: int = 0
    preempt_requested_at: datetime | None = None
    preempt_reason: str | None = None
    preempted_for: str | None = None
    quota: QuotaRecord | None = None
    fine_tuned_model: str | None = None
    result_files: list[str] = field(default_factory=list)   # OpenAI's result_files: file.created of the job
    fenced_attempt: int = 0                  # attempts up to this one were fenced: their events are refused
    last_activity_at: datetime | None = None  # last sign of life of the state's work (timeouts count from it)
    timeouts: int = 0                        # segments given up on by a timeout
    node_losses: int = 0                     # attempts ended by a lost node (domain/gang.py bounds the re-queues)
    lost_nodes: list[str] = field(default_factory=list)   # the nodes those losses named, each once
    notes: list[Note] = field(default_factory=list, repr=False, compare=False)   # unsaved timeline lines

    # ------------------------------------------------------------ queries

    @property
    def public_status(self) -> str:
        """OpenAI's status; a job whose pause was accepted shows `paused` while its node checkpoints."""
        return "paused" if self.pausing else PUBLIC_STATUS.get(self.status, self.status)

    @property
    def pausing(self) -> bool:
        """Its tenant paused it while it ran: the node is writing the emergency checkpoint and stopping."""
        return self.on_node and self.preempt_reason == PreemptRequestReason.PAUSE

    @property
    def terminal(self) -> bool:
        return self.status in rules.TERMINAL

    @property
    def on_node(self) -> bool:
        return self.status in rules.ACTIVE_ON_NODE

    def result_file_made(self, now: datetime, file_id: str) -> bool:
        """Ingest made the job's results file (a file of the tenant's): listed in `result_files`."""
        if file_id in self.result_files:
            return False
        self.result_files = [*self.result_files, file_id]
        self.note(now, f"results file ready: {file_id}", file_id=file_id)
        return True

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return self.resources.shapes

    @property
    def method(self) -> SpecMethod:
        return self.request.method

    @property
    def training_file(self) -> str:
        return self.request.training_file

    def nodes_held(self) -> list[str]:
        return list(self.node_ids) or ([self.node_id] if self.node_id else [])

    def attempt_of(self, segment_id: str | None, attempt: int | None) -> int | None:
        """The attempt an event speaks for: its own field, else the one its segment id names
        (`<job>-s<attempt>`); None for an event that names neither."""
        if attempt is not None:
            return attempt
        if segment_id is None or not segment_id.startswith(self.job_id):
            return None
        match = SEGMENT_ATTEMPT.search(segment_id)
        return int(match.group(1)) if match else None

    def stale(self, segment_id: str | None, attempt: int | None, *, stop_report: bool = False) -> str | None:
        """Why an event of this attempt must have no effect (a fenced or superseded attempt), or None.
        ``stop_report``: a job.preempted of a superseded (not fenced) attempt is another gang member
        reporting the stop that already re-queued the job: not refused (the segment check ignores it)."""
        seen = self.attempt_of(segment_id, attempt)
        if seen is None:
            return None
        if seen <= self.fenced_attempt:
            return f"attempt {seen} of job {self.job_id} was fenced (the scheduler gave up on its node)"
        if seen < self.attempt and not stop_report:
            return f"attempt {seen} of job {self.job_id} is older than its current attempt {self.attempt}"
        return None

    # ------------------------------------------------------------ helpers

    def note(self, now: datetime, message: str, level: str = "info", type: str = "message", **data: Any) -> None:
        self.notes.append(Note(now, message, level, type, data))

    def _move(self, target: JobStatus, now: datetime, message: str, **data: Any) -> bool:
        if not rules.can_transition(self.status, target):
            return False
        self.status, self.updated_at = target, now
        if target in rules.TERMINAL and self.finished_at is None:
            self.finished_at = now
        self.note(now, message, status=target, **data)
        return True

    def _merge_failed(self, error: str) -> list[Event]:
        """A merge job the scheduler ends (a timeout, a cancel) answers its merge request too."""
        merge = self.request.merge if self.method == SpecMethod.MERGE else None
        if merge is None:
            return []
        return [ModelMergedV1(merge_id=merge.merge_id, model_id=merge.model_id, status=MergeStatus.FAILED,
                              merge_job_id=self.job_id, error=error)]

    def _leave_nodes(self) -> None:
        self.node_id, self.gpu_ids, self.placement, self.node_ids = None, [], [], []

    def queued_event(self, position: int | None, cost: CostEstimate | None = None,
                     requeued: bool = False) -> JobQueuedV1:
        first, used = self.shapes[0], self.request.template   # the template the registry's lineage names
        assert self.spec is not None, "a queued job has its spec"
        return JobQueuedV1(job_id=self.job_id, tier=self.tier, spec=self.spec,
                           resources=Resources(gpu_type=first.gpu_type, gpus_per_node=first.gpus_per_node,
                                               nodes=first.nodes),
                           queue_position=position, cost_estimate=cost, requeued=requeued,
                           suffix=self.request.suffix, integrations=self.request.integrations,
                           job_template=used.name if used else None,
                           job_template_version=str(used.version) if used else None,
                           job_template_overrides=list(used.overrides) if used else [])

    # -------------------------------------------------------- transitions

    def fail(self, now: datetime, code: str, message: str, error_class: ErrorClass = ErrorClass.USER,
             param: str | None = None) -> list[Event]:
        if not self._move(rules.FAILED, now, message, code=code):
            return []
        self._leave_nodes()
        self.error = JobError(code=code, message=message, error_class=error_class, param=param)
        return [JobFailedV1(job_id=self.job_id, error_class=error_class, code=code, message=message),
                *self._merge_failed(f"{code}: {message}")]

    def queue(self, now: datetime, spec: TrainingSpec, sort_key: float, runtime_s: float, quota: QuotaRecord,
              position: int, cost: CostEstimate) -> list[Event]:
        """Out of validating_files once the dataset is accepted and the estimate fits the quota; or out
        of paused (resumed): queued again like a new job (the pause gave up its place), resuming from
        its latest checkpoint, announced as a re-queue."""
        resumed = self.status == rules.PAUSED
        at = self.latest_checkpoint
        if not self._move(rules.QUEUED, now, "job queued" if not resumed else "Job resumed: re-queued; " + (
                f"resumes from its checkpoint at step {at.step}" if at else "no checkpoint, starts from the beginning")):
            return []
        self.spec, self.queued_at, self.sort_key = spec, now, sort_key
        self.queued_since = now
        self.estimated_runtime_s, self.quota = runtime_s, quota
        return [self.queued_event(position, cost, requeued=resumed)]

    def assign(self, now: datetime, placement: list[PlacedPart], shape: Shape, spot: bool, backfilled: bool,
               default_runtime_s: float, addresses: Mapping[str, str | None]) -> list[Event]:
        """A new segment on these nodes and GPU ids: every gang member gets its part of it."""
        devices = "CPU slots" if shape.gpu_type == "cpu" else f"{shape.gpu_type} GPUs"   # a CPU node is no GPU
        where = ", ".join(f"{p.node_id} {devices} {p.gpu_ids}" for p in placement)
        if not self._move(rules.PROVISIONING, now, f"assigned to {where}" + (" (backfilled)" if backfilled else "")):
            return []
        self.attempt += 1
        self.segment_id = f"{self.job_id}-s{self.attempt}"
        since = self.queued_since or self.queued_at
        self.waited_s += max((now - since).total_seconds(), 0.0) if since else 0.0
        self.queued_since = None
        self.placement = placement
        self.node_ids = [p.node_id for p in placement]
        self.node_id, self.gpu_ids = placement[0].node_id, list(placement[0].gpu_ids)
        remaining = (self.estimated_runtime_s or default_runtime_s) * (1 - self.progress.fraction())
        self.segment_started_at, self.est_end_at = now, now + timedelta(seconds=remaining)
        self.last_checkpoint_at, self.last_activity_at = None, now
        self.resources = self.resources.model_copy(update={"assigned": AssignedShape(
            gpu_type=shape.gpu_type, gpus_per_node=shape.gpus_per_node, nodes=shape.nodes, spot=spot)})
        assert self.spec is not None, "a queued job has its spec"
        spec, resume = self.spec, self.latest_checkpoint.ref() if self.latest_checkpoint else None
        meeting = rendezvous(self.node_ids, addresses)
        return [JobAssignedV1(job_id=self.job_id, node_id=p.node_id, segment_id=self.segment_id,
                              attempt=self.attempt, gpu_ids=p.gpu_ids, spec=spec, resume_from=resume,
                              rendezvous=rdzv) for p, rdzv in zip(placement, meeting, strict=True)]

    def request_preemption(self, now: datetime, reason: str, message: str,
                           for_job: str | None = None) -> list[Event]:
        """Tell the node(s) to checkpoint and stop; the agent's job.preempted then re-queues the job."""
        if not self.on_node or self.preempt_requested_at is not None:
            return []
        self.preempt_requested_at, self.preempt_reason, self.preempted_for = now, reason, for_job
        self.updated_at = now
        self.note(now, f"{message}: checkpoint and stop requested; the job resumes from its checkpoint when "
                  "capacity frees", level="warning", reason=reason, for_job=for_job)
        known = {r.value for r in PreemptRequestReason}
        return self._stop_commands(PreemptRequestReason(reason) if reason in known else PreemptRequestReason.PRIORITY)

    def _stop_commands(self, reason: PreemptRequestReason) -> list[Event]:
        return [JobPreemptRequestedV1(job_id=self.job_id, node_id=node, segment_id=self.segment_id, reason=reason,
                                      for_job_id=self.preempted_for) for node in self.node_ids]

    def pause(self, now: datetime) -> list[Event]:
        """The tenant pauses the job. Queued: it leaves the queue at once. Training: the preemption
        path with reason `pause` (emergency checkpoint, GPUs released); the node's job.preempted then
        parks it as paused instead of re-queueing it (`preempted`); a stop already under way is not
        asked again. Provisioning (no training reported yet, so nothing new to checkpoint): the attempt
        is given up (fenced) and parked at once. Paused or pausing already: nothing."""
        if self.status == rules.QUEUED:
            since = self.queued_since or self.queued_at
            self.waited_s += max((now - since).total_seconds(), 0.0) if since else 0.0
            self.queued_since = None
            self._move(rules.PAUSED, now, "Job paused: it left the queue; resume it to queue it again")
            return []
        if not self.on_node or self.pausing:
            return []
        asked = self.preempt_requested_at is not None
        self.preempt_requested_at = self.preempt_requested_at or now
        self.preempt_reason, self.preempted_for, self.updated_at = PreemptRequestReason.PAUSE, None, now
        if self.status == rules.PROVISIONING:
            return self.give_up_segment(now, PreemptionReason.PAUSE, 0)
        self.note(now, "Job pause requested: " + ("the node is already stopping it" if asked else
                  "emergency checkpoint and stop requested"), reason=PreemptRequestReason.PAUSE)
        return [] if asked else self._stop_commands(PreemptRequestReason.PAUSE)

    def give_up_segment(self, now: datetime, reason: PreemptionReason, position: int, node_id: str | None = None,
                        requeue: bool = True) -> list[Event]:
        """The scheduler gives up on the current attempt (its node was lost, or it timed out): the
        segment is reported preempted with the true basis (`checkpointed_at`: when its latest
        checkpoint was written, if this segment wrote one), every node of it is told to stop
        (`node.fenced`), the attempt is fenced (its later events are refused) and the job re-queued
        from its latest checkpoint. The next assignment takes the next attempt number."""
        if not self.on_node or self.segment_id is None:
            return []
        nodes = self.nodes_held()
        own = self.last_checkpoint_at is not None        # set only by a checkpoint of this segment
        lost = JobPreemptedV1(job_id=self.job_id, segment_id=self.segment_id, attempt=self.attempt,
                              node_id=node_id or (nodes[0] if nodes else ""), reason=PreemptionReason(reason), stopped_at=now,
                              checkpoint=self.latest_checkpoint.ref() if self.latest_checkpoint else None,
                              checkpointed_at=self.last_checkpoint_at if own else None)
        fences = [NodeFencedV1(job_id=self.job_id, node_id=n, segment_id=self.segment_id, attempt=self.attempt,
                               reason=reason) for n in nodes]
        self.fenced_attempt = self.attempt
        self.note(now, f"attempt {self.attempt} fenced ({reason}): node(s) {', '.join(nodes)} told to stop; "
                  "its later events are refused", level="warning", reason=reason, attempt=self.attempt)
        if not requeue:
            return [lost, *fences]
        return [lost, *fences, *self.preempted(now, reason, None, position)]

    def time_out(self, now: datetime, state: str, limit_s: float, position: int) -> list[Event]:
        """A platform-side timeout: evaluating fails the job (platform); a segment on a node is
        given up and re-queued, until it has timed out MAX_TIMEOUT_REQUEUES times (then it fails)."""
        what = {"provisioning": "no job.started", "running": "no progress", "checkpointing": "no job.preempted after "
                "a checkpoint-and-stop request", "evaluating": "no eval.completed"}[state]
        message = f"{state} timed out: {what} within {limit_s:.0f}s"
        if state == "evaluating" or not self.on_node:
            return self.fail(now, f"{state}_timeout", message, error_class=ErrorClass.PLATFORM)
        self.timeouts += 1
        self.note(now, message, level="warning", state=state, timeouts=self.timeouts)
        if self.timeouts < MAX_TIMEOUT_REQUEUES:
            return self.give_up_segment(now, PreemptionReason.PLATFORM_TIMEOUT, position)
        return [*self.give_up_segment(now, PreemptionReason.PLATFORM_TIMEOUT, position, requeue=False),
                *self.fail(now, f"{state}_timeout", f"{message} ({self.timeouts} segments timed out; the platform "
                           "gave up)", error_class=ErrorClass.PLATFORM)]

    def preempted(self, now: datetime, reason: str, checkpoint: CheckpointRef | None, position: int) -> list[Event]:
        """Stopped (spot loss, priority, lost node, drain): counted, then always back in the queue with
        the same job id and queue time, resuming from its latest checkpoint."""
        if not rules.can_transition(self.status, rules.PREEMPTED):
            return []
        if checkpoint is not None and checkpoint.step >= self.latest_step():
            self.latest_checkpoint = StoredCheckpoint(uri=checkpoint.uri, step=checkpoint.step,
                                                      manifest_sha256=checkpoint.manifest_sha256,
                                                      kind=CheckpointKind.EMERGENCY)
        assigned = self.resources.assigned
        on_spot = assigned is not None and assigned.spot
        counts_spot = reason == "spot_loss" or (on_spot and reason in ("node_lost", "drain", "signal"))
        counts_priority = reason == "priority" or self.preempt_reason == "priority"
        paused = self.preempt_reason == PreemptRequestReason.PAUSE
        self._move(rules.PREEMPTED, now, f"stopped on its node ({reason})" if paused else f"preempted ({reason})")
        self.spot_preemptions += int(counts_spot)
        self.priority_preemptions += int(counts_priority)
        self._leave_nodes()
        self.preempt_requested_at = self.preempt_reason = self.preempted_for = None
        self.last_activity_at = now
        if paused:   # the tenant's pause: parked off the queue until resumed
            at = self.latest_checkpoint
            self._move(rules.PAUSED, now, "Job paused: GPUs released; "
                       + (f"resumes from its checkpoint at step {at.step}" if at else "no checkpoint yet, resumes "
                          "from the beginning"), checkpoint_step=at.step if at else None)
            return []
        self.queued_since = now
        self._move(rules.QUEUED, now, "re-queued; resumes from its latest checkpoint" if self.latest_checkpoint
                   else "re-queued; no checkpoint yet, restarts from the beginning")
        return [self.queued_event(position, requeued=True)]

    def started(self, now: datetime, node_id: str, started_at: datetime, total_steps: int | None,
                resumed_from_step: int | None) -> None:
        if self._move(rules.RUNNING, now, f"training started on {node_id}"
                      + (f", resumed from step {resumed_from_step}" if resumed_from_step else "")):
            self.started_at = self.started_at or started_at
            self.last_activity_at = now
            self.progress = self.progress.model_copy(update={"total_steps": total_steps})

    def progressed(self, now: datetime, metrics: Progress) -> bool:
        """A training step's metrics (newer steps only); the first one shows the job running."""
        step = metrics.step or 0
        if not self.on_node or step < (-1 if self.progress.step is None else self.progress.step):
            return False
        self.progress, self.updated_at, self.last_activity_at = metrics, now, now
        step_metrics = metrics.model_dump(exclude_none=True, exclude={"total_steps"})
        self.note(now, f"step {step}" + (f"/{metrics.total_steps}" if metrics.total_steps else "")
                  + (f": training loss={metrics.loss:.4f}" if metrics.loss is not None else ""),
                  type="metrics", **step_metrics)
        if self.status == rules.PROVISIONING:
            self._move(rules.RUNNING, now, "training running")
        return True

    def latest_step(self) -> int:
        return -1 if self.latest_checkpoint is None else self.latest_checkpoint.step

    def checkpoint_written(self, now: datetime, segment_id: str, kind: CheckpointKind, step: int, uri: str,
                           manifest_sha256: str, written_at: datetime) -> bool:
        """True when it becomes the job's latest checkpoint."""
        self.note(now, f"{kind} checkpoint at step {step}", uri=uri)
        if step < self.latest_step():
            return False
        self.latest_checkpoint = StoredCheckpoint(uri=uri, step=step, manifest_sha256=manifest_sha256, kind=kind,
                                                  segment_id=segment_id, written_at=written_at)
        if segment_id == self.segment_id:
            self.last_checkpoint_at = written_at   # the refund basis if this segment is lost
            if self.on_node:
                self.last_activity_at = now
        return True

    def training_completed(self, now: datetime, steps: int, tokens: int | None, final: CheckpointRef) -> bool:
        """Training jobs go on to evaluation; a merge job (nothing to evaluate) succeeds here."""
        merge = self.method == SpecMethod.MERGE
        if not self._move(rules.EVALUATING, now, "merged weights stored" if merge
                          else f"training finished after {steps} steps; evaluating"):
            return False
        self.trained_tokens, self.last_activity_at = tokens, now
        self._leave_nodes()
        self.latest_checkpoint = StoredCheckpoint(uri=final.uri, step=final.step,
                                                  manifest_sha256=final.manifest_sha256, kind=CheckpointKind.FINAL)
        if merge:
            self._move(rules.SUCCEEDED, now, "merge job succeeded")
        elif self.early_eval is not None:
            early, self.early_eval = self.early_eval, None
            if early.checkpoint_uri == final.uri:   # the verdict is about this very checkpoint
                self.evaluated(now, early)
        return True

    def training_failed(self, now: datetime, code: str, message: str, error_class: ErrorClass) -> bool:
        """A failed job (NaN loss, bad data, crash) is terminal: never re-queued automatically."""
        if not self._move(rules.FAILED, now, message, code=code):
            return False
        self._leave_nodes()
        self.error = JobError(code=code, message=message, error_class=error_class)
        return True

    def evaluated(self, now: datetime, result: EvalCompletedV1) -> bool:
        """The gate's verdict. It may overtake `job.completed` (another topic, no order between them):
        while training has not completed it is kept, and applied when it does if it names the same
        final checkpoint (an attempt fenced meanwhile wrote another). The job succeeds once the verdict
        and its registered model (`fine_tuned_model`) are both known, in either order: a client that
        polls until `succeeded` always reads the model's name. A cancelled job takes no verdict."""
        if self.status == rules.CANCELLED:
            return False
        verdict = result.verdict
        if self.status != rules.EVALUATING and not self.terminal and not result.request_id:
            self.early_eval = result
            self.note(now, f"evaluation {verdict} arrived before training reported completion; kept until it does")
            return False
        for s in result.stages:
            self.note(now, f"eval stage {s.name}: {s.status} ({s.reason})",
                      level="warning" if s.status == StageStatus.FAILED else "info", type="message",
                      stage=s.name, stage_status=s.status)
        if self.status != rules.EVALUATING:
            return False
        self.eval, self.last_activity_at = result, now
        self.note(now, f"evaluation {verdict}: {'; '.join(result.reasons)}", verdict=verdict)
        self._succeed_when_registered(now)
        return True

    def _succeed_when_registered(self, now: datetime) -> None:
        """Evaluating -> succeeded once both the verdict and the registered model are in."""
        if self.status == rules.EVALUATING and self.eval is not None and self.fine_tuned_model:
            self._move(rules.SUCCEEDED, now, f"job succeeded: model {self.fine_tuned_model}")

    def cancel(self, now: datetime) -> list[Event]:
        """Cancel wins from any state before succeeded. The job.cancelled events name the attempts the
        job was ever given (`attempt`): every node, eval and the registry void the job on them (a node
        drops or kills its segment, nothing of it is registered), and metering closes the job as
        cancelled once the segments of those attempts are accounted for."""
        nodes = self.nodes_held()
        if not self._move(rules.CANCELLED, now, "cancelled by user"):
            return []
        self._leave_nodes()
        self.preempt_requested_at = self.preempt_reason = self.preempted_for = None
        held: list[str | None] = [*nodes] or [None]
        return [*(JobCancelledV1(job_id=self.job_id, node_id=node, attempt=self.attempt) for node in held),
                *self._merge_failed("cancelled: the merge job was cancelled")]

    def model_registered(self, now: datetime, name: str, model_id: str) -> None:
        """The registry made a model of the job. A cancelled job keeps no model (the registry withdraws
        one registered before the cancel reached it); otherwise the job succeeds if its verdict is in."""
        if self.status == rules.CANCELLED:
            self.note(now, f"model {name} was registered after the job was cancelled: not the job's result; "
                      "the registry withdraws it", level="warning", model_id=model_id)
            return
        if self.fine_tuned_model != name:
            self.fine_tuned_model = name
            self.note(now, f"model registered: {name}", model_id=model_id)
        self._succeed_when_registered(now)


def new_job(job_id: str, tenant_id: str, fingerprint: str, request: JobRequest, tier: str,
            base_model: str, base_model_sha256: str, resources: JobResources, now: datetime,
            trace_id: str) -> Job:
    """A job just admitted: waiting for its training file's verdict (validating_files)."""
    job = Job(job_id=job_id, tenant_id=tenant_id, idempotency_key=request.idempotency_key, fingerprint=fingerprint,
              request=request, status=rules.VALIDATING, tier=tier, created_at=now, updated_at=now, trace_id=trace_id,
              base_model=base_model, base_model_sha256=base_model_sha256, priority=rules.TIER_PRIORITY[tier],
              resources=resources)
    shapes = ", ".join(f"{s.nodes}x{s.gpus_per_node} {s.gpu_type}" for s in job.shapes[:3])
    job.note(now, f"job created; needs about {resources.memory_gb.total:.1f} GB: {shapes}",
             model=request.model, training_file=request.training_file, resources=resources.model_dump(mode="json"))
    return job
