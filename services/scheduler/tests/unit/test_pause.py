"""Pause and resume in the job aggregate, without a database: a queued job leaves the queue; a job
on a node takes the preemption path with reason `pause` and is parked as paused (not re-queued) when
its node reports the stop; resuming goes back through `Job.queue`, announced as a re-queue, and the
next assignment resumes from the emergency checkpoint; refusals name the state."""

from datetime import UTC, datetime, timedelta

import pytest

from whetstone.contracts import CheckpointRef, CostEstimate, JobPreemptRequestedV1, JobQueuedV1, TrainingSpec
from whetstone.contracts.enums import CheckpointKind, PreemptionReason
from whetstone.scheduler.domain import jobs as rules
from whetstone.scheduler.domain.job import Job, new_job
from whetstone.scheduler.domain.job_data import JobRequest, JobResources, MemoryGb, PlacedPart, QuotaRecord
from whetstone.scheduler.domain.pausing import pause_refusal, resume_refusal
from whetstone.scheduler.domain.placement import Shape

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 28, 1, 0, tzinfo=UTC)
SPEC = TrainingSpec(base_model="m", base_model_sha256="a" * 64, dataset_id="ds", dataset_version="v",
                    train_uri="s3://x", method="dpo", hyperparameters={"n_epochs": 1}, hyperparameters_hash="h")
EMERGENCY = CheckpointRef(uri="s3://ck/7", step=7, manifest_sha256="b" * 64)


def queued() -> Job:
    request = JobRequest(job_id="ftjob-p", idempotency_key="k", model="m", training_file="ds", method="dpo")
    job = new_job("ftjob-p", "demo", "fp", request, "standard", "m", "a" * 64,
                  JobResources(shapes=(Shape("A100", 1),), memory_gb=MemoryGb(total=10.0)), T0, "trace")
    job.queue(T0, SPEC, 100.0, 600.0, QuotaRecord(), 0, CostEstimate())
    return job


def running(at: datetime = T0) -> Job:
    job = queued()
    job.assign(at, [PlacedPart(node_id="n1", gpu_ids=[0])], Shape("A100", 1), False, False, 3600.0, {})
    job.started(at, "n1", at, 20, None)
    return job


def test_pausing_a_queued_job_takes_it_out_of_the_queue_and_resuming_queues_it_again():
    job = queued()
    assert job.pause(T0 + timedelta(seconds=30)) == [] and job.status == rules.PAUSED
    assert job.public_status == "paused" and job.waited_s == 30.0 and job.queued_since is None
    assert job.pause(T0 + timedelta(seconds=40)) == [] and job.status == rules.PAUSED   # twice: unchanged
    resumed_at = T0 + timedelta(minutes=5)
    [event] = job.queue(resumed_at, SPEC, 500.0, 600.0, QuotaRecord(), 2, CostEstimate())
    assert isinstance(event, JobQueuedV1) and event.requeued and event.queue_position == 2
    assert job.status == rules.QUEUED and job.queued_since == resumed_at and job.sort_key == 500.0
    messages = [n.message for n in job.notes]
    assert any(m.startswith("Job paused") for m in messages) and any(m.startswith("Job resumed") for m in messages)


def test_pausing_a_running_job_asks_its_node_to_checkpoint_and_parks_it_when_the_node_stops():
    job = running()
    [command] = job.pause(T0 + timedelta(seconds=10))
    assert isinstance(command, JobPreemptRequestedV1) and command.reason == "pause" and command.node_id == "n1"
    assert job.status == rules.RUNNING and job.pausing and job.public_status == "paused"
    assert job.pause(T0 + timedelta(seconds=11)) == []     # a pause in flight: asked once
    events = job.preempted(T0 + timedelta(seconds=20), PreemptionReason.PAUSE, EMERGENCY, 0)
    assert events == [] and job.status == rules.PAUSED and not job.pausing   # parked: no job.queued
    assert job.node_ids == [] and job.gpu_ids == [] and job.preempt_requested_at is None
    assert job.latest_checkpoint is not None and job.latest_checkpoint.step == 7
    assert job.latest_checkpoint.kind == CheckpointKind.EMERGENCY
    assert (job.spot_preemptions, job.priority_preemptions) == (0, 0)   # a pause is no preemption
    assert any(n.message == "Job paused: GPUs released; resumes from its checkpoint at step 7" for n in job.notes)
    job.queue(T0 + timedelta(minutes=1), SPEC, 200.0, 600.0, QuotaRecord(), 0, CostEstimate())
    [assigned] = job.assign(T0 + timedelta(minutes=2), [PlacedPart(node_id="n2", gpu_ids=[0])], Shape("A100", 1),
                            False, False, 3600.0, {})
    assert assigned.attempt == 2 and assigned.resume_from == EMERGENCY


def test_a_pause_during_a_priority_preemption_parks_the_job_instead_of_requeueing_it():
    job = running()
    sent = job.request_preemption(T0, "priority", "preempted for higher-priority job x", "ftjob-x")
    assert len(sent) == 1
    assert job.pause(T0 + timedelta(seconds=1)) == []    # the node is stopping already: not asked again
    assert job.public_status == "paused"
    assert job.preempted(T0 + timedelta(seconds=5), PreemptionReason.PRIORITY, EMERGENCY, 0) == []
    assert job.status == rules.PAUSED


def test_a_pausing_job_whose_node_is_lost_is_parked_too():
    job = running()
    job.pause(T0)
    events = job.give_up_segment(T0 + timedelta(minutes=1), PreemptionReason.NODE_LOST, 0)
    assert [e.EVENT_TYPE for e in events] == ["job.preempted", "node.fenced"]   # no job.queued
    assert job.status == rules.PAUSED and job.fenced_attempt == 1


def test_a_job_paused_before_its_training_began_is_stopped_and_parked_at_once():
    """Provisioning: no process may be there to take a SIGTERM yet, and nothing new to checkpoint: the
    attempt is fenced (the node stops it without reporting) and the job parked, not left to a timeout."""
    job = queued()
    job.assign(T0, [PlacedPart(node_id="n1", gpu_ids=[0])], Shape("A100", 1), False, False, 3600.0, {})
    events = job.pause(T0 + timedelta(seconds=3))
    assert [e.EVENT_TYPE for e in events] == ["job.preempted", "node.fenced"]
    assert events[0].reason == "pause" and events[0].checkpoint is None
    assert job.status == rules.PAUSED and job.fenced_attempt == 1 and job.node_ids == []
    job.queue(T0 + timedelta(minutes=1), SPEC, 200.0, 600.0, QuotaRecord(), 0, CostEstimate())
    [assigned] = job.assign(T0 + timedelta(minutes=2), [PlacedPart(node_id="n1", gpu_ids=[0])], Shape("A100", 1),
                            False, False, 3600.0, {})
    assert assigned.attempt == 2 and assigned.resume_from is None


def test_cancel_wins_over_a_paused_job():
    job = running()
    job.pause(T0)
    job.preempted(T0 + timedelta(seconds=5), PreemptionReason.PAUSE, EMERGENCY, 0)
    [cancelled] = job.cancel(T0 + timedelta(seconds=9))
    assert cancelled.attempt == 1 and job.status == rules.CANCELLED


@pytest.mark.parametrize("status, pausable", [
    (rules.VALIDATING, False), (rules.QUEUED, True), (rules.PROVISIONING, True), (rules.RUNNING, True),
    (rules.PAUSED, True), (rules.EVALUATING, False), (rules.SUCCEEDED, False), (rules.FAILED, False),
    (rules.CANCELLED, False)])
def test_only_queued_training_or_paused_jobs_may_be_paused_and_refusals_name_the_status(status, pausable):
    job = queued()
    job.status = status
    why = pause_refusal(job)
    assert (why is None) == pausable
    if why:
        assert f"is {job.public_status}" in why and "only a queued or running job can be paused" in why


def test_only_a_paused_job_may_be_resumed():
    job = running()
    assert "is running, not paused" in (resume_refusal(job) or "")
    job.pause(T0)
    assert "still pausing" in (resume_refusal(job) or "")
    job.preempted(T0, PreemptionReason.PAUSE, EMERGENCY, 0)
    assert resume_refusal(job) is None
