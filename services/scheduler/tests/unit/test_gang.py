"""When one node of a gang ends the segment, the scheduler stops the ranks on the others (node.fenced)."""

from whetstone.scheduler.domain.gang import lost_peers_note, peers_to_stop


class _Job:
    """The three things `peers_to_stop` reads of a job."""

    def __init__(self, nodes: list[str], segment_id: str | None = "job-1-s2", attempt: int = 2) -> None:
        self.job_id, self.segment_id, self.attempt, self._nodes = "job-1", segment_id, attempt, nodes

    def nodes_held(self) -> list[str]:
        return list(self._nodes)


def test_every_other_node_of_the_gang_is_fenced_for_the_attempt():
    fences = peers_to_stop(_Job(["node-a", "node-b", "node-c"]), "node-b", "job-1-s2")   # type: ignore[arg-type]
    assert [(f.node_id, f.segment_id, f.attempt) for f in fences] == [("node-a", "job-1-s2", 2),
                                                                       ("node-c", "job-1-s2", 2)]
    assert all(f.reason == "gang_member_ended:node-b" for f in fences)


def test_single_node_jobs_and_other_segments_stop_nothing():
    assert peers_to_stop(_Job(["node-a"]), "node-a", "job-1-s2") == []                      # type: ignore[arg-type]
    assert peers_to_stop(_Job(["node-a", "node-b"]), "node-a", "job-1-s1") == []           # type: ignore[arg-type]
    assert peers_to_stop(_Job(["node-a", "node-b"], segment_id=None), "node-a", None) == []  # type: ignore[arg-type]


# ------------------------------------------------------------------ a gang member's loss is the gang's


def _running_gang():
    """A real job aggregate placed on a two-node gang (node a is rank 0), training."""
    from datetime import UTC, datetime

    from whetstone.contracts import TrainingSpec
    from whetstone.scheduler.domain.job import new_job
    from whetstone.scheduler.domain.job_data import JobRequest, JobResources, MemoryGb, PlacedPart, QuotaRecord
    from whetstone.scheduler.domain.placement import Shape

    t0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    spec = TrainingSpec(base_model="m", base_model_sha256="a" * 64, dataset_id="ds", dataset_version="v",
                        train_uri="s3://x", method="lora", hyperparameters={"n_epochs": 1}, hyperparameters_hash="h")
    shape = Shape("cpu", 1, 2)
    request = JobRequest(job_id="ftjob-1", idempotency_key="k", model="m", training_file="ds", method="lora")
    job = new_job("ftjob-1", "demo", "fp", request, "free", "m", "a" * 64,
                  JobResources(shapes=(shape,), memory_gb=MemoryGb(total=1.0)), t0, "trace-1")
    job.queue(t0, spec, 100.0, 600.0, QuotaRecord(), 1, {"estimated_gpu_hours": 1.0})
    job.assign(t0, [PlacedPart(node_id="a", gpu_ids=[0]), PlacedPart(node_id="b", gpu_ids=[0])], shape, False,
               False, 60.0, {"a": "127.0.0.1", "b": "127.0.0.1"})
    job.started(t0, "a", t0, 10, None)
    return job


def test_losing_either_node_of_a_gang_fences_the_attempt_on_both_and_requeues_the_gang():
    from whetstone.contracts import JobPreemptedV1, JobQueuedV1, NodeFencedV1
    from whetstone.scheduler.domain import jobs as rules
    from whetstone.scheduler.domain.job import Job

    for lost in ("a", "b"):        # rank 0's node or the other one: the same for the gang
        job: Job = _running_gang()
        assert job.node_ids == ["a", "b"]
        events = job.give_up_segment(job.updated_at, "node_lost", 1, lost)
        preempted = [e for e in events if isinstance(e, JobPreemptedV1)]
        assert [(e.node_id, e.reason, e.attempt) for e in preempted] == [(lost, "node_lost", 1)]
        assert sorted((e.node_id, e.attempt) for e in events if isinstance(e, NodeFencedV1)) == [("a", 1), ("b", 1)]
        assert [e.requeued for e in events if isinstance(e, JobQueuedV1)] == [True]
        assert job.status == rules.QUEUED and job.node_ids == [] and job.fenced_attempt == 1
        assert job.stale("ftjob-1-s1", 1) is not None    # either node's late report of the attempt is refused


def test_a_node_lost_report_from_a_gang_member_names_the_other_nodes():
    job = _Job(["node-a", "node-b", "node-c"], segment_id="job-1-s2", attempt=2)
    note = lost_peers_note(job, "node-a", "job-1-s2", "node_lost")   # type: ignore[arg-type]
    assert note is not None and "node(s) node-b, node-c" in note and note.startswith("node node-a lost")
    assert "attempt 2" in note
    assert lost_peers_note(job, "node-a", "job-1-s2", "spot_loss") is None          # type: ignore[arg-type]
    assert lost_peers_note(job, "node-a", "job-1-s1", "node_lost") is None          # type: ignore[arg-type]
    assert lost_peers_note(_Job(["node-a"]), "node-a", "job-1-s2", "node_lost") is None   # type: ignore[arg-type]
    assert lost_peers_note(job, "node-z", "job-1-s2", "node_lost") is None          # not a member


# ------------------------------------------------------------------ re-queues after lost nodes are bounded


def _assign_again(job):
    from whetstone.scheduler.domain.job_data import PlacedPart
    from whetstone.scheduler.domain.placement import Shape

    job.assign(job.updated_at, [PlacedPart(node_id="a", gpu_ids=[0]), PlacedPart(node_id="b", gpu_ids=[0])],
               Shape("cpu", 1, 2), False, False, 60.0, {"a": "127.0.0.1", "b": "127.0.0.1"})


def test_a_gang_re_queued_after_lost_nodes_up_to_the_bound_then_fails_naming_the_nodes():
    from whetstone.contracts import JobFailedV1, JobPreemptedV1, JobQueuedV1, NodeFencedV1
    from whetstone.scheduler.domain import jobs as rules
    from whetstone.scheduler.domain.gang import lose_node, node_stopped

    job = _running_gang()
    # 1: node b's heartbeat timed out (the scheduler's watcher); 2: node a reports its collective with b broke
    events = lose_node(job, job.updated_at, "b", "node_lost", 1, limit=2)
    assert [e.requeued for e in events if isinstance(e, JobQueuedV1)] == [True] and job.node_losses == 1
    _assign_again(job)
    report = JobPreemptedV1(job_id=job.job_id, segment_id=job.segment_id, node_id="a", attempt=job.attempt,
                            reason="node_lost", stopped_at=job.updated_at)
    assert [e.requeued for e in node_stopped(job, job.updated_at, report, 1, limit=2)] == [True]
    assert job.status == rules.QUEUED and job.lost_nodes == ["b"]
    # a late report of an attempt already given up changes nothing and is not counted
    assert node_stopped(job, job.updated_at, report, 1, limit=2) == [] and job.node_losses == 2
    # 3: past the bound the job fails (platform), naming the nodes lost, its GPUs released, both nodes fenced
    _assign_again(job)
    events = lose_node(job, job.updated_at, "a", "node_lost", 1, limit=2)
    (failed,) = [e for e in events if isinstance(e, JobFailedV1)]
    assert (failed.code, failed.error_class) == ("nodes_lost", "platform")
    assert "Nodes lost: b, a" in failed.message and "re-queued 2 times" in failed.message
    assert not [e for e in events if isinstance(e, JobQueuedV1)]
    assert sorted(e.node_id for e in events if isinstance(e, NodeFencedV1)) == ["a", "b"]
    assert job.status == rules.FAILED and job.node_ids == [] and job.placement == [] and job.error is not None


def test_other_stops_do_not_count_against_the_node_loss_bound():
    from whetstone.contracts import JobPreemptedV1, JobQueuedV1
    from whetstone.scheduler.domain.gang import lose_node, node_stopped

    job = _running_gang()
    events = lose_node(job, job.updated_at, "b", "spot_loss", 1, limit=0)   # a spot reclaim is no lost node
    assert [e.requeued for e in events if isinstance(e, JobQueuedV1)] == [True] and job.node_losses == 0
    _assign_again(job)
    drained = JobPreemptedV1(job_id=job.job_id, segment_id=job.segment_id, node_id="a", attempt=job.attempt,
                             reason="drain", stopped_at=job.updated_at)
    assert [e.requeued for e in node_stopped(job, job.updated_at, drained, 1, limit=0)] == [True]
    assert job.node_losses == 0 and job.lost_nodes == []
