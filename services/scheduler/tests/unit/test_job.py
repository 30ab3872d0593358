"""The job aggregate's state machine, without a database: transitions return the events to
publish, refused transitions change nothing, preemption counts and re-queueing follow the rules."""

from datetime import UTC, datetime, timedelta

import pytest

from whetstone.contracts import (
    CheckpointRef, CostEstimate, EvalCompletedV1, EvalStageResult, JobAssignedV1, JobCancelledV1, JobFailedV1, JobPreemptedV1, JobPreemptRequestedV1, JobQueuedV1,
    NodeFencedV1, TrainingSpec,
)
from whetstone.scheduler.domain import jobs as rules
from whetstone.scheduler.domain.job import Job, new_job
from whetstone.scheduler.domain.timeouts import Timeouts, overdue
from whetstone.scheduler.domain.job_data import (
    AssignedShape, JobRequest, JobResources, MemoryGb, PlacedPart, Progress, QuotaRecord,
)
from whetstone.scheduler.domain.placement import Shape

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
SPEC = TrainingSpec(base_model="m", base_model_sha256="a" * 64, dataset_id="ds", dataset_version="v", train_uri="s3://x",
                    method="lora", hyperparameters={"n_epochs": 1}, hyperparameters_hash="h")
CK = CheckpointRef(uri="s3://ck/5", step=5, manifest_sha256="b" * 64)
RESOURCES = JobResources(shapes=(Shape("A100", 8, 2),), memory_gb=MemoryGb(total=10.0))


def fresh(suffix: str | None = None) -> Job:
    request = JobRequest(job_id="ftjob-1", idempotency_key="k", model="m", training_file="ds", method="lora",
                         suffix=suffix)
    return new_job("ftjob-1", "demo", "fp", request, "free", "m", "a" * 64, RESOURCES, T0, "trace-1")


def part(node: str, gpus: list[int]) -> PlacedPart:
    return PlacedPart(node_id=node, gpu_ids=gpus)


def verdict(uri: str = CK.uri, request_id: str | None = None, verdict: str = "passed") -> EvalCompletedV1:
    return EvalCompletedV1(job_id="ftjob-1", checkpoint_uri=uri, verdict=verdict, reasons=["ok"], metrics=[],
                           request_id=request_id)


def queued() -> Job:
    job = fresh()
    events = job.queue(T0, SPEC, 100.0, 600.0, QuotaRecord(), 3, CostEstimate(estimated_gpu_hours=1.0))
    assert [type(e) for e in events] == [JobQueuedV1] and events[0].queue_position == 3
    return job


def running(spot: bool = False) -> Job:
    job = queued()
    placement = [part("a", list(range(8))), part("b", list(range(8)))]
    events = job.assign(T0, placement, Shape("A100", 8, 2), spot, False, 3600.0, {"a": "10.0.0.1"})
    assert [e.node_id for e in events] == ["a", "b"] and all(isinstance(e, JobAssignedV1) for e in events)
    job.started(T0, "a", T0, 100, None)
    return job


def test_a_new_job_waits_for_its_file_and_notes_why():
    job = fresh()
    assert job.status == rules.VALIDATING and job.public_status == "validating_files"
    assert "needs about 10.0 GB" in job.notes[0].message


def test_assignment_opens_a_segment_for_the_whole_gang_with_a_rendezvous():
    job = running()
    assert job.attempt == 1 and job.segment_id == "ftjob-1-s1" and job.node_ids == ["a", "b"]
    assert job.status == rules.RUNNING and job.public_status == "running"
    assert job.est_end_at == T0 + timedelta(seconds=600.0)
    assert job.resources.assigned == AssignedShape(gpu_type="A100", gpus_per_node=8, nodes=2, spot=False)
    assert any(n.message.startswith("assigned to a A100 GPUs [0,") for n in job.notes)


def test_a_cpu_node_is_named_as_cpu_slots_not_gpus():
    job = queued()
    job.assign(T0, [part("cpu-node", [0])], Shape("cpu", 1), False, False, 60.0, {})
    assert any(n.message == "assigned to cpu-node CPU slots [0]" for n in job.notes), [n.message for n in job.notes]


def test_refused_transitions_change_nothing_and_publish_nothing():
    job = fresh()
    assert job.assign(T0, [part("a", [0])], Shape("A100", 1), False, False, 1.0, {}) == []
    assert job.status == rules.VALIDATING and job.attempt == 0
    job = running()
    job.fail(T0, "x", "boom")
    before = (job.status, job.spot_preemptions, job.latest_checkpoint)
    assert job.preempted(T0, "spot_loss", CK, 1) == []
    assert (job.status, job.spot_preemptions, job.latest_checkpoint) == before
    assert job.cancel(T0) == []


def test_preemption_counts_and_requeues_with_the_newest_checkpoint():
    job = running(spot=False)
    requested = job.request_preemption(T0, "priority", "for a premium job", "ftjob-9")
    assert [type(e) for e in requested] == [JobPreemptRequestedV1] * 2 and requested[0].for_job_id == "ftjob-9"
    assert job.request_preemption(T0, "priority", "again", "ftjob-9") == []    # asked once
    events = job.preempted(T0, "signal", CK, 4)
    assert job.status == rules.QUEUED and job.priority_preemptions == 1 and job.spot_preemptions == 0
    assert job.latest_checkpoint.step == 5 and job.node_ids == [] and job.preempt_requested_at is None
    assert isinstance(events[0], JobQueuedV1) and events[0].requeued and events[0].queue_position == 4
    assert job.sort_key == 100.0   # keeps its place in the queue
    # an older checkpoint never replaces a newer one; a lost spot node counts as a spot preemption
    job.assign(T0, [part("c", [0])], Shape("A100", 1), True, False, 1.0, {})
    job.preempted(T0, "node_lost", CheckpointRef(uri="s3://ck/2", step=2, manifest_sha256="c" * 64), 1)
    assert job.latest_checkpoint.step == 5 and job.spot_preemptions == 1 and job.attempt == 2


def test_progress_only_moves_forward_and_checkpoints_keep_the_latest():
    job = running()
    assert job.progressed(T0, Progress(step=10, loss=1.5, total_steps=100))
    assert not job.progressed(T0, Progress(step=9, loss=9.0))
    assert job.progress.step == 10 and job.notes[-1].type == "metrics"
    assert job.checkpoint_written(T0, job.segment_id, "periodic", 10, "s3://ck/10", "d" * 64, T0)
    assert not job.checkpoint_written(T0, job.segment_id, "periodic", 8, "s3://ck/8", "e" * 64, T0)
    assert job.latest_checkpoint.step == 10 and job.last_checkpoint_at == T0


def test_failure_is_terminal_and_cancellation_tells_every_node():
    job = running()
    events = job.cancel(T0)
    assert [(type(e), e.node_id, e.attempt) for e in events] == [(JobCancelledV1, "a", 1), (JobCancelledV1, "b", 1)]
    assert job.terminal and job.finished_at == T0 and job.public_status == "cancelled"
    job = queued()
    (failed,) = job.fail(T0, "larger_than_pool", "too big")
    assert isinstance(failed, JobFailedV1) and job.error.code == "larger_than_pool"
    assert not job.training_failed(T0, "x", "y", "user") and job.error.code == "larger_than_pool"


def test_completion_evaluation_and_the_registered_model():
    job = running()
    assert job.training_completed(T0, 100, 5000, CK)
    assert job.status == rules.EVALUATING and job.public_status == "running" and job.node_ids == []
    stages = [EvalStageResult(name="holdout", status="passed", reason="ok"),
              EvalStageResult(name="safety", status="failed", reason="refusals")]
    assert job.evaluated(T0, verdict(verdict="failed").model_copy(update={"stages": stages}))
    # `succeeded` only once the model is registered, so a poller never reads fine_tuned_model=None
    assert job.status == rules.EVALUATING and job.public_status == "running" and job.eval.verdict == "failed"
    assert [n.level for n in job.notes if "eval stage" in n.message] == ["info", "warning"]
    job.model_registered(T0, "demo-m-ft-1", "mdl-1")
    assert job.fine_tuned_model == "demo-m-ft-1" and job.public_status == "succeeded"
    # the model may reach the scheduler before the verdict (two topics): the verdict then ends the job
    job = running()
    job.model_registered(T0, "demo-m-ft-2", "mdl-2")
    assert job.training_completed(T0, 100, 5000, CK) and job.status == rules.EVALUATING
    assert job.evaluated(T0, verdict()) and job.public_status == "succeeded"


def test_cancel_wins_in_evaluating_and_the_job_takes_no_verdict_or_model_after_it():
    job = running()
    assert job.training_completed(T0, 100, 5000, CK)
    (cancelled,) = job.cancel(T0)
    assert isinstance(cancelled, JobCancelledV1) and cancelled.attempt == 1 and cancelled.node_id is None
    assert not job.evaluated(T0, verdict())
    job.model_registered(T0, "demo-m-ft-3", "mdl-3")
    assert job.public_status == "cancelled" and job.fine_tuned_model is None and job.eval is None
    # never placed on a node: the cancel says so (attempt 0), so metering can close the job at once
    assert [e.attempt for e in queued().cancel(T0)] == [0]


def test_a_verdict_that_overtakes_the_training_completion_is_applied_when_it_arrives():
    """eval.completed and job.completed travel on different topics: the verdict may come first
    (chaos: the scheduler restarted between them). Before, it was dropped and the job sat in
    `evaluating` until its timeout failed it."""
    job = running()
    result = verdict()
    assert not job.evaluated(T0, result)
    assert job.status == rules.RUNNING and job.early_eval == result and job.eval is None
    assert job.training_completed(T0, 100, 5000, CK)
    assert job.status == rules.EVALUATING and job.eval == result
    job.model_registered(T0, "demo-m-ft-1", "mdl-1")
    assert job.public_status == "succeeded"
    # a verdict about another checkpoint (an attempt fenced meanwhile) is not this training's
    job = running()
    assert not job.evaluated(T0, verdict(uri="s3://ck/other-a1"))
    assert job.training_completed(T0, 100, 5000, CK)
    assert job.status == rules.EVALUATING and job.eval is None
    # a re-evaluation answer never stands in for the job's own gate
    job = running()
    assert not job.evaluated(T0, verdict(request_id="r1")) and job.eval is None


def test_giving_up_a_lost_segment_reports_its_checkpoint_fences_every_node_and_requeues():
    job = running()
    written = T0 + timedelta(seconds=40)
    assert job.checkpoint_written(T0 + timedelta(seconds=41), "ftjob-1-s1", "periodic", 5, CK.uri, CK.manifest_sha256,
                                  written)
    lost, *fences, requeued = job.give_up_segment(T0 + timedelta(seconds=60), "node_lost", 1, "a")
    assert isinstance(lost, JobPreemptedV1) and lost.attempt == 1 and lost.reason == "node_lost"
    assert lost.checkpointed_at == written and lost.checkpoint.step == 5
    assert all(isinstance(f, NodeFencedV1) and f.attempt == 1 for f in fences) and [f.node_id for f in fences] == ["a", "b"]
    assert isinstance(requeued, JobQueuedV1) and requeued.requeued and job.status == rules.QUEUED
    assert job.fenced_attempt == 1 and job.stale("ftjob-1-s1", None) and job.stale(None, 1)
    assert job.give_up_segment(T0, "node_lost", 1) == []           # not on a node any more: nothing


def test_a_segment_without_its_own_checkpoint_states_none_was_written():
    job = running()
    job.checkpoint_written(T0, "ftjob-0-s9", "periodic", 5, CK.uri, CK.manifest_sha256, T0)   # an older segment's
    lost = job.give_up_segment(T0 + timedelta(seconds=60), "node_lost", 1)[0]
    assert lost.checkpointed_at is None and lost.checkpoint.step == 5     # resumes from it, but this segment lost all


def test_stale_attempts_superseded_or_fenced_and_attempt_less_events_by_their_segment():
    job = running()
    assert job.stale("ftjob-1-s1", 1) is None and job.stale(None, None) is None
    job.attempt, job.segment_id = 2, "ftjob-1-s2"
    assert "older" in job.stale("ftjob-1-s1", None) and "older" in job.stale(None, 1)
    assert job.stale("ftjob-1-s2", None) is None
    assert job.stale("ftjob-1-s1", None, stop_report=True) is None       # a gang member's late stop report
    job.fenced_attempt = 1
    assert "fenced" in job.stale("ftjob-1-s1", None, stop_report=True)


def test_each_platform_side_state_has_a_timeout():
    limits = Timeouts(provisioning=10, running=20, checkpointing=30, evaluating=40)
    job = queued()
    job.assign(T0, [part("a", [0])], Shape("A100", 1), False, False, 60.0, {})
    assert overdue(job, T0 + timedelta(seconds=9), limits) is None
    assert overdue(job, T0 + timedelta(seconds=11), limits) == "provisioning"
    job.progressed(T0 + timedelta(seconds=5), Progress(step=1))
    assert overdue(job, T0 + timedelta(seconds=24), limits) is None
    assert overdue(job, T0 + timedelta(seconds=26), limits) == "running"
    job.request_preemption(T0 + timedelta(seconds=20), "priority", "for another job")
    assert overdue(job, T0 + timedelta(seconds=49), limits) is None
    assert overdue(job, T0 + timedelta(seconds=51), limits) == "checkpointing"
    events = job.time_out(T0 + timedelta(seconds=51), "checkpointing", 30, 1)
    assert events[0].reason == "platform_timeout" and job.status == rules.QUEUED and job.timeouts == 1
    job.assign(T0, [part("a", [0])], Shape("A100", 1), False, False, 60.0, {})
    job.training_completed(T0 + timedelta(seconds=60), 4, None, CK)
    assert overdue(job, T0 + timedelta(seconds=101), limits) == "evaluating"
    (failed,) = job.time_out(T0 + timedelta(seconds=101), "evaluating", 40, 1)
    assert isinstance(failed, JobFailedV1) and failed.error_class == "platform" and failed.code == "evaluating_timeout"


def test_the_queued_event_carries_the_suffix():
    job = fresh(suffix="bot")
    (ev,) = job.queue(T0, SPEC, 1.0, 1.0, QuotaRecord(), 1, CostEstimate())
    assert ev.suffix == "bot"


def test_queue_wait_is_counted_over_every_queue_period_not_the_time_between():
    # 10 min queued, 5 h on a node, preempted, 20 min queued again: 30 min of waiting, although the
    # job was first queued over 5 h ago (it keeps that queue time for its place in the order)
    job = queued()
    job.assign(T0 + timedelta(minutes=10), [part("a", [0])], Shape("A100", 1), False, False, 1.0, {})
    assert job.waited_s == pytest.approx(600.0) and job.queued_since is None
    back = T0 + timedelta(hours=5, minutes=10)
    job.preempted(back, "priority", CK, 1)
    assert job.queued_since == back and job.queued_at == T0
    job.assign(back + timedelta(minutes=20), [part("b", [0])], Shape("A100", 1), False, False,
               1.0, {})
    assert job.waited_s == pytest.approx(1800.0)
