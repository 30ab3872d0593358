"""The agent's pure rules about runs: checkpoint names, retention and resume order, exit
classification, capacity, attempt fences, child events and image pins."""

from __future__ import annotations

import signal

import pytest
from whetstone.contracts import CheckpointRef
from whetstone.contracts import Rendezvous as AssignedRendezvous
from whetstone.trainer_agent.adapters.runs import _run
from whetstone.trainer_agent.domain.checkpoints import (
    AttemptFence,
    StaleAttempt,
    StoredCheckpoint,
    checkpoint_prefix,
    checkpoint_ref,
    checkpoints_in,
    job_checkpoints_prefix,
    parse_checkpoint,
    resume_candidates,
    to_prune,
)
from whetstone.trainer_agent.domain.launch import gang_devices
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    Completed,
    Failed,
    Outcome,
    Progress,
    Validation,
    parse_event,
)
from whetstone.trainer_agent.domain.supervision import (
    ProgressCadence,
    classify_exit,
    describe_exit,
    free_gpu_ids,
    job_progress,
    preempt_reason,
    stop_reason,
)

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------ checkpoints


JOB = job_checkpoints_prefix("demo", "job-1")


def ck(step: int, kind: str = "periodic") -> StoredCheckpoint:
    return StoredCheckpoint(checkpoint_prefix("demo", "job-1", step, kind), step, kind)


def test_checkpoint_prefix_round_trip():
    prefix = checkpoint_prefix("demo", "job-1", 40, "emergency")
    assert prefix == "tenants/demo/jobs/job-1/checkpoints/step-00000040-emergency"
    assert parse_checkpoint(prefix + "/") == StoredCheckpoint(prefix, 40, "emergency")
    assert parse_checkpoint("tenants/demo/jobs/job-1/checkpoints/step-40-final") is None
    with pytest.raises(ValueError):
        checkpoint_prefix("demo", "job-1", 1, "hourly")


def test_checkpoints_in_a_listing():
    keys = [f"{ck(10).prefix}/manifest.json", f"{ck(10).prefix}/adapter_model.safetensors",
            f"{ck(20, 'emergency').prefix}/optimizer.pt", f"{JOB}README", "tenants/demo/other/x",
            f"{ck(30, 'final').prefix}/nested/file.bin"]
    assert checkpoints_in(keys, JOB) == [ck(10), ck(20, "emergency"), ck(30, "final")]


def test_prune_keeps_the_last_k_resumable_and_every_final():
    cks = [ck(10), ck(20), ck(30), ck(40), ck(40, "final")]
    assert to_prune(cks, keep_last=2, protected=()) == [ck(10), ck(20)]
    assert to_prune(cks, keep_last=10, protected=()) == []


def test_prune_never_deletes_the_checkpoint_a_resume_points_to():
    cks = [ck(10), ck(20), ck(30), ck(40)]
    assert to_prune(cks, keep_last=1, protected={ck(20).prefix + "/"}) == [ck(10), ck(30)]


def test_emergency_is_newer_than_periodic_at_the_same_step():
    assert to_prune([ck(20, "emergency"), ck(20)], keep_last=1, protected=()) == [ck(20)]


def test_resume_candidates_requested_first_then_older_newest_first():
    cks = [ck(10), ck(20), ck(30, "emergency"), ck(40), ck(50, "final")]
    got = resume_candidates(cks, ck(30, "emergency").prefix, max_step=30)
    assert got == [ck(30, "emergency"), ck(20), ck(10)]


def test_resume_candidates_ignore_newer_unacknowledged_and_final_checkpoints():
    cks = [ck(10), ck(20), ck(25, "final")]
    assert resume_candidates(cks, ck(15).prefix, max_step=15) == [ck(10)]
    assert resume_candidates(cks, None) == [ck(20), ck(10)]


# ------------------------------------------------------------------ supervision


def test_a_crash_is_a_platform_failure_with_the_log_tail():
    report = classify_exit(-signal.SIGKILL, cancelled=False, stopping=None, worker_node=False,
                           log_tail="x" * 5000 + "\nTraceback: boom")
    assert (report.outcome, report.error_class, report.code) == ("failed", "platform", "trainer_crashed")
    assert "killed by SIGKILL" in report.message and report.message.endswith("Traceback: boom")
    assert len(report.message) < 2200


def test_a_clean_exit_without_a_result_is_still_a_failure():
    report = classify_exit(0, cancelled=False, stopping=None, worker_node=False, log_tail="")
    assert report.outcome == "failed" and "exited with code 0" in report.message and "no log" in report.message


def test_cancel_wins_and_is_a_user_failure():
    report = classify_exit(-signal.SIGTERM, cancelled=True, stopping="drain", worker_node=False, log_tail="")
    assert (report.outcome, report.error_class, report.code) == ("failed", "user", "cancelled")


def test_agent_stop_is_a_preemption():
    report = classify_exit(-signal.SIGKILL, cancelled=False, stopping="spot_loss", worker_node=False, log_tail="")
    assert report.outcome == "preempted" and report.reason == "spot_loss"


def test_other_nodes_of_a_multi_node_job_do_not_report_success():
    assert classify_exit(0, cancelled=False, stopping=None, worker_node=True, log_tail="").outcome == "worker_done"
    assert classify_exit(1, cancelled=False, stopping=None, worker_node=True, log_tail="").outcome == "failed"


def test_describe_exit():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-15) == "killed by SIGTERM"
    assert describe_exit(None) == "still running"


def test_preempt_and_stop_reasons():
    assert preempt_reason("drain", "signal") == "drain"
    assert preempt_reason(None, "priority") == "priority"
    assert preempt_reason(None, "weird") == "signal"
    assert stop_reason(spot=True) == "spot_loss" and stop_reason(spot=False) == "drain"


def test_free_gpu_ids_reflect_running_segments_and_drain():
    assert free_gpu_ids(4, [[0], [2, 3]], draining=False) == [1]
    assert free_gpu_ids(4, [], draining=False) == [0, 1, 2, 3]
    assert free_gpu_ids(4, [], draining=True) == []


def test_failure_message_carries_the_recipes_advice():
    failed = Failed(message="loss diverged", advice=["lower learning_rate", "raise warmup_ratio"])
    assert failed.full_message() == "loss diverged Suggested changes: lower learning_rate; raise warmup_ratio."
    assert parse_event('{"event": "failed"}') == Failed(error_class="platform", code="training_failed",
                                                         message="training failed")
    assert Failed(message="x").full_message() == "x"


def test_checkpoint_names_carry_the_attempt_and_order_by_it():
    prefix = checkpoint_prefix("demo", "job-1", 40, "periodic", attempt=3)
    assert prefix == "tenants/demo/jobs/job-1/checkpoints/step-00000040-periodic-a3"
    assert parse_checkpoint(prefix) == StoredCheckpoint(prefix, 40, "periodic", 3)
    legacy = parse_checkpoint(checkpoint_prefix("demo", "job-1", 40, "periodic"))
    assert legacy.attempt == 0 and legacy.order() < parse_checkpoint(prefix).order()
    with pytest.raises(ValueError):
        checkpoint_prefix("demo", "job-1", 40, "periodic", attempt=0)
    keys = [f"{prefix}/manifest.json", f"{JOB}fence.json"]  # the fence is not a checkpoint
    assert checkpoints_in(keys, JOB) == [StoredCheckpoint(prefix, 40, "periodic", 3)]


def test_attempt_fence_refuses_only_older_attempts():
    fence = AttemptFence("demo", "job-1", 2)
    assert fence.key == "tenants/demo/jobs/job-1/checkpoints/fence.json"
    fence.check(None)
    fence.check(1)
    fence.check(2)
    with pytest.raises(StaleAttempt, match="attempt 2 is stale"):
        fence.check(3)


def test_run_from_a_row_and_checkpoint_refs_from_stored_json():
    ck = {"uri": "s3://b/tenants/demo/jobs/j/checkpoints/step-00000010-periodic-a1", "step": 10,
          "manifest_sha256": "a" * 64, "extra": "ignored"}
    assert checkpoint_ref(ck) == CheckpointRef(uri=ck["uri"], step=10, manifest_sha256="a" * 64)
    assert checkpoint_ref(None) is None
    spec = {"base_model": "m", "base_model_sha256": "0" * 64, "dataset_id": "ds", "dataset_version": "v1",
            "train_uri": "s3://b/t", "method": "lora", "hyperparameters": {}, "hyperparameters_hash": "h"}
    row = {"segment_id": "j-s2", "job_id": "j", "node_id": "n", "tenant_id": "demo", "trace_id": "t", "attempt": 2,
           "gpu_ids": [0, 1], "spec": spec, "resume_from": ck, "rendezvous": None, "status": "running",
           "latest_checkpoint": None, "pid": None, "pid_start": None}
    run = _run(row)
    assert run.gpu_ids == (0, 1) and run.durable_checkpoint == checkpoint_ref(ck)
    assert run.fence == AttemptFence("demo", "j", 2) and run.spec.method == "lora" and not run.is_merge
    later = _run({**row, "latest_checkpoint": {**ck, "step": 20}})
    assert later.durable_checkpoint.step == 20
    gang = _run({**row, "rendezvous": {"master_addr": "10.0.0.1", "node_rank": 1, "nodes": 2,
                                       "hosts": ["10.0.0.1", "10.0.0.2"]}})
    assert gang.rendezvous == AssignedRendezvous(master_addr="10.0.0.1", node_rank=1, nodes=2,
                                                 hosts=["10.0.0.1", "10.0.0.2"])


def test_child_events_become_job_events():
    line = '{"event": "progress", "step": 5, "total_steps": 10, "loss": 1.5, "job_id": "j", "time": 1.0, "junk": 1}'
    progress = parse_event(line)
    assert isinstance(progress, Progress)   # a field this side does not know is ignored
    job = job_progress(progress, job_id="j", segment_id="j-s1", attempt=1)
    assert (job.step, job.total_steps, job.loss, job.grad_norm) == (5, 10, 1.5, None)
    accurate = progress.model_copy(update={"mean_token_accuracy": 0.5, "validation": Validation(loss=2.0)})
    job = job_progress(accurate, job_id="j", segment_id="j-s1", attempt=1)
    assert (job.token_accuracy, job.validation_loss) == (0.5, 2.0)  # the trainer's own name; the checkpoint's
    assert parse_event("not json") is None and parse_event('{"event": "progress"}') is None   # not events
    assert parse_event('{"event": "unknown"}') is None


def test_progress_is_reported_at_a_steady_step_cadence():
    cadence = ProgressCadence(interval_s=1.0)
    times = {1: 3.0, 2: 0.25, **{s: 0.25 for s in range(3, 41)}}   # a slow first (warm-up) step, then 4 steps/s
    due = [s for s in range(1, 41) if cadence.due(Progress(step=s, total_steps=40, step_time_s=times[s]))]
    assert due == [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40]     # first, second, then every 4th and the last
    fast = ProgressCadence(interval_s=1.0)
    due = [s for s in range(1, 101) if fast.due(Progress(step=s, total_steps=100,
                                                         step_time_s=1.0 if s < 50 else 0.01))]
    assert due[:4] == [1, 2, 3, 4] and due[-1] == 100
    assert [s for s in due if 50 <= s < 100] == [64, 96]   # 100 steps/s: the stride doubles to 32, same grid



def test_completed_and_checkpoint_metrics_are_flat_and_measured_only():
    done = Completed(job_id="j", time=2.0, step=10, train_loss=0.5, outcome=Outcome(images=3),
                     validation=Validation(loss=1.25, tokens=40))
    assert done.metrics() == {"step": 10, "train_loss": 0.5, "images": 3, "validation_loss": 1.25,
                              "validation_tokens": 40}
    checkpoint = Checkpoint(kind="periodic", step=4, path="/x", validation=Validation(loss=1.0, tokens=9,
                                                                                    mean_token_accuracy=0.5))
    assert checkpoint.metrics() == {"validation_loss": 1.0, "validation_mean_token_accuracy": 0.5}


# ------------------------------------------------------------------ gangs (several nodes)


def test_rank_zero_reports_the_devices_of_the_whole_gang():
    assert gang_devices(AssignedRendezvous(master_addr="a", nodes=2, node_rank=0), 1) == 2
    assert gang_devices(AssignedRendezvous(master_addr="a", nodes=3), 4) == 12
    assert gang_devices(None, 2) == 2 and gang_devices(None, 0) == 1


def test_a_gang_rank_whose_peer_vanished_is_a_lost_node_not_a_failed_job():
    from whetstone.contracts.enums import ErrorClass
    from whetstone.trainer_agent.domain.supervision import gang_peer_lost

    closed = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234"
    timed_out = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv"
    assert gang_peer_lost(2, ErrorClass.PLATFORM, closed) and gang_peer_lost(2, None, timed_out)
    assert not gang_peer_lost(1, ErrorClass.PLATFORM, closed)              # one node: a real crash
    assert not gang_peer_lost(2, ErrorClass.USER, closed)                  # the job's own error stays its own
    assert not gang_peer_lost(2, ErrorClass.PLATFORM, "ValueError: bad tensor shape")


def test_a_job_pinned_to_a_trainer_image_trains_only_where_that_digest_runs():
    from whetstone.trainer_agent.domain.runs import image_pin_problem

    digest = "sha256:" + "d" * 64
    pin = f"ghcr.io/whetstone/trainer@{digest}"
    assert image_pin_problem(None, None) is None   # no pin: any agent
    assert image_pin_problem(pin, pin) is None
    assert image_pin_problem(pin, f"registry.local:5000/mirror/trainer@{digest}") is None   # same bytes
    assert image_pin_problem(pin, digest) is None   # the agent knows only its digest
    other = image_pin_problem(pin, "ghcr.io/whetstone/trainer@sha256:" + "e" * 64)
    assert other is not None and pin in other and "(image)" in other and "e" * 64 in other
    unknown = image_pin_problem(pin, None)
    assert unknown is not None and "WHETSTONE_IMAGE_DIGEST" in unknown
