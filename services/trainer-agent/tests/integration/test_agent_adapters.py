"""The agent's adapters against the real things: checkpoints in SeaweedFS (manifest checks,
fallback past corrupt or manifest-less checkpoints, pruning), process groups and the
death-signal shim, model sizes from safetensors headers, snapshots and log tails."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from botocore.exceptions import EndpointConnectionError
from whetstone.devstack.stack import EmbeddedStack
from whetstone.runtime.checkpoints import MANIFEST, CorruptCheckpoint
from whetstone.runtime.delivery import unavailable_dependency
from whetstone.runtime.s3 import ObjectStore
from whetstone.trainer_agent.adapters.checkpoint_store import S3Checkpoints
from whetstone.trainer_agent.adapters.model_size import param_count
from whetstone.trainer_agent.adapters.processes import (
    kill_orphan,
    log_tail,
    snapshot,
    start_ticks,
)
from whetstone.trainer_agent.domain.checkpoints import (
    AttemptFence,
    StaleAttempt,
    checkpoint_prefix,
)

pytestmark = pytest.mark.integration

TENANT, JOB = "demo", "job-ck"


def fake_checkpoint(root: Path, step: int) -> Path:
    d = root / f"checkpoint-{step}"
    (d / "sub").mkdir(parents=True, exist_ok=True)
    (d / "adapter_model.safetensors").write_bytes(os.urandom(2048))
    (d / "sub" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def upload(ck: S3Checkpoints, root: Path, step: int, kind: str = "periodic", job: str = JOB):
    prefix = checkpoint_prefix(TENANT, job, step, kind)
    return prefix, ck.upload(fake_checkpoint(root, step), prefix, {"job_id": job, "step": step, "kind": kind})


def ref(prefix: str, step: int, up) -> dict:
    return {"uri": up.uri, "step": step, "manifest_sha256": up.manifest_sha256}


async def test_a_stale_attempt_can_neither_write_nor_prune_checkpoints(settings, tmp_path):
    """A node that lost its job (partitioned, declared lost) wakes up after attempt 2 started:
    its uploads and prunes are refused and leave nothing behind; attempt 2's checkpoints stay."""
    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    ck = S3Checkpoints(store)
    job = "job-fenced"
    old, new = AttemptFence(TENANT, job, 1), AttemptFence(TENANT, job, 2)

    def write(fence: AttemptFence, step: int):
        prefix = checkpoint_prefix(TENANT, job, step, "periodic", fence.attempt)
        ck.upload_snapshot(fake_checkpoint(tmp_path / f"a{fence.attempt}", step), tmp_path / "staged", prefix,
                           {"job_id": job, "step": step, "kind": "periodic"}, fence=fence, attempts=1)
        return prefix

    ck.claim(old)
    first = write(old, 10)
    ck.claim(new)                      # the job moved on: attempt 2 starts (and may resume from attempt 1's)
    assert ck.fenced_attempt(old) == 2
    mine = write(new, 10)              # same step, other name: nothing of attempt 2 can be overwritten
    assert mine != first
    with pytest.raises(StaleAttempt):
        write(old, 20)
    with pytest.raises(StaleAttempt):
        ck.prune(TENANT, job, keep_last=1, protected=set(), fence=old)
    with pytest.raises(StaleAttempt):
        ck.claim(old)                  # a redelivered old assignment cannot take the job back
    assert [(c.step, c.attempt) for c in ck.list_job(TENANT, job)] == [(10, 1), (10, 2)]
    assert ck.prune(TENANT, job, keep_last=1, protected=set(), fence=new) == [first]


async def test_checkpoint_store_verifies_falls_back_and_prunes(settings, tmp_path):
    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    ck = S3Checkpoints(store)
    p10, u10 = upload(ck, tmp_path / "local", 10)
    p20, u20 = upload(ck, tmp_path / "local", 20)
    p30, u30 = upload(ck, tmp_path / "local", 30, "emergency")
    p40, _ = upload(ck, tmp_path / "local", 40, "final")
    assert [(c.step, c.kind) for c in ck.list_job(TENANT, JOB)] == [(10, "periodic"), (20, "periodic"),
                                                                    (30, "emergency"), (40, "final")]

    manifest, digest = ck.fetch_verified(p30, tmp_path / "dl", job_id=JOB)
    assert digest == u30.manifest_sha256 and set(manifest.files) == {"adapter_model.safetensors",
                                                                        "sub/trainer_state.json"}
    assert json.loads((tmp_path / "dl" / "sub" / "trainer_state.json").read_text())["global_step"] == 30

    # a pinned manifest that was replaced is not the checkpoint the scheduler knows
    with pytest.raises(CorruptCheckpoint, match="not the pinned"):
        ck.fetch_verified(p30, tmp_path / "dl", expected_manifest_sha256="0" * 64)

    # a real corrupted object in SeaweedFS: the requested checkpoint is skipped for the previous one
    store.put_bytes(f"{p30}/adapter_model.safetensors", b"garbage")
    point = ck.resume_point(TENANT, JOB, ref(p30, 30, u30), tmp_path / "resume")
    assert (point.step, point.uri, point.manifest_sha256) == (20, u20.uri, u20.manifest_sha256)
    assert point.skipped[0][0] == u30.uri and "does not match its sha256" in point.skipped[0][1]
    assert json.loads((point.path / "sub" / "trainer_state.json").read_text())["global_step"] == 20

    # an upload that died before its manifest: that checkpoint does not exist
    store.client.delete_object(Bucket=store.bucket, Key=f"{p20}/{MANIFEST}")
    point = ck.resume_point(TENANT, JOB, ref(p30, 30, u30), tmp_path / "resume")
    assert point.step == 10 and [why for _, why in point.skipped][1].endswith("no manifest")
    assert json.loads((point.path / "sub" / "trainer_state.json").read_text())["global_step"] == 10

    # a manifest of another job under this job's prefix is rejected
    other_prefix, other = upload(ck, tmp_path / "other", 10, job="job-other")
    store.put_bytes(f"{p10}/{MANIFEST}", store.get_bytes(f"{other.uri}/{MANIFEST}"))
    with pytest.raises(CorruptCheckpoint, match="belongs to job 'job-other'"):
        ck.fetch_verified(p10, tmp_path / "dl", job_id=JOB)
    # a manifest whose entries are not {sha256, size}: unreadable, and the message names the entry
    good = store.get_bytes(store.uri(f"{p10}/{MANIFEST}"))
    for bad, where in ((b'{"files": {"a.bin": {"sha256": "not-hex"}}}', "files.a.bin.sha256"),
                       (b'{"files": ["a.bin"]}', "files"), (b'{"job_id": "' + JOB.encode() + b'"}', "files")):
        store.put_bytes(f"{p10}/{MANIFEST}", bad)
        with pytest.raises(CorruptCheckpoint, match=f"unreadable manifest \\({where}: "):
            ck.fetch_verified(p10, tmp_path / "dl", job_id=JOB)
    store.put_bytes(f"{p10}/{MANIFEST}", good)

    # nothing verifies: start from scratch (and say what was skipped)
    point = ck.resume_point(TENANT, JOB, ref(p30, 30, u30), tmp_path / "resume")
    assert point.path is None and point.ref() is None and len(point.skipped) == 3
    assert not (tmp_path / "resume").exists()
    assert ck.resume_point(TENANT, JOB, None, tmp_path / "resume").skipped == []

    # pruning: keep the newest resumable one and the protected one; finals stay; nothing half-deleted remains
    p50, _ = upload(ck, tmp_path / "local", 50)
    deleted = ck.prune(TENANT, JOB, keep_last=1, protected={p20})
    assert deleted == [p10, p30]
    assert [(c.step, c.kind) for c in ck.list_job(TENANT, JOB)] == [(20, "periodic"), (40, "final"),
                                                                    (50, "periodic")]
    assert list(store.list_keys(p10 + "/")) == [] and list(store.list_keys(p30 + "/")) == []
    assert ck.list_job(TENANT, "job-other")[0].prefix == other_prefix


@pytest.mark.parametrize("wrong_ticks", [True, False])
def test_kill_orphan_kills_only_the_recorded_process(wrong_ticks):
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = start_ticks(proc.pid)
        assert ticks is not None
        killed = kill_orphan(proc.pid, ticks + 1 if wrong_ticks else ticks)
        assert killed is not wrong_ticks
        if wrong_ticks:
            assert proc.poll() is None
        else:
            assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    assert kill_orphan(proc.pid, ticks) is False   # gone: nothing to do
    assert kill_orphan(None, None) is False


def test_training_processes_die_with_their_agent(tmp_path):
    """The death-signal shim: SIGKILL the parent (the 'agent') and its launcher dies too."""
    parent_code = (  # spawned as the agent spawns its launchers (adapters.processes.spawn)
        "import os, subprocess, sys, time\n"
        "from whetstone.runtime import pdeathsig\n"
        "p = subprocess.Popen(pdeathsig.wrap(['sleep', '60']),"
        " start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while "sleep" not in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
            assert time.monotonic() < deadline, "shim never exec'd the launcher"
            time.sleep(0.05)
        parent.kill()
        parent.wait(timeout=5)
        deadline = time.monotonic() + 10
        while start_ticks(child) is not None and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, "launcher outlived its agent"
            time.sleep(0.05)
    finally:
        parent.kill()


def test_param_count_reads_safetensors_headers(tiny_base):
    from safetensors import safe_open

    with safe_open(tiny_base / "model.safetensors", framework="np") as f:
        expected = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    assert param_count(str(tiny_base)) == expected > 0
    assert param_count("meta-llama/Llama-3.1-8B") == 8e9      # not local: read off the name


def test_snapshot_survives_the_trainer_deleting_its_checkpoint(tmp_path):
    src = fake_checkpoint(tmp_path, 7)
    digest = hashlib.sha256((src / "adapter_model.safetensors").read_bytes()).hexdigest()
    snap = snapshot(src, tmp_path / "snap")
    shutil.rmtree(src)                                   # e.g. the trainer's own rotation
    assert hashlib.sha256((snap / "adapter_model.safetensors").read_bytes()).hexdigest() == digest
    assert (snap / "sub" / "trainer_state.json").is_file()


def test_log_tail(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"x" * 10_000 + "Traceback: \u00e9chec".encode())
    assert log_tail(log, 100).endswith("Traceback: \u00e9chec") and len(log_tail(log, 100)) <= 100
    assert log_tail(tmp_path / "missing.log") == ""


def test_the_final_checkpoint_upload_outlasts_an_s3_restart(tmp_path):
    """A final checkpoint is not lost to an S3 restart: its upload keeps retrying while S3 is unreachable,
    for up to `outage_budget_s`, beyond the attempts an ordinary failure gets. A chaos run failed a sound
    job with `no_final_checkpoint`: SeaweedFS was restarting when its training finished, and the fence
    check before the upload could not reach S3. The real SeaweedFS, killed and started again."""
    with EmbeddedStack(tmp_path / "stack", buckets=["whetstone"], log=lambda m: None) as stack:
        e = stack.endpoints
        checkpoints = S3Checkpoints(ObjectStore(e.s3_endpoint, e.s3_access_key, e.s3_secret_key, "whetstone"))
        job = "job-outage"
        fence = AttemptFence(TENANT, job, 1)
        checkpoints.claim(fence)
        local = fake_checkpoint(tmp_path / "run", 8)
        prefix = checkpoint_prefix(TENANT, job, 8, "final")
        meta = {"job_id": job, "step": 8, "kind": "final"}
        retries: list[Exception] = []

        def upload(budget_s: float):
            return checkpoints.upload_snapshot(local, tmp_path / "staged", prefix, meta, fence=fence, attempts=2,
                                               outage_budget_s=budget_s,
                                               on_retry=lambda attempt, exc: retries.append(exc))

        stack.stop_component("s3", kill=True)
        with pytest.raises(EndpointConnectionError):  # without a budget: two attempts, then the error
            upload(0.0)
        assert len(retries) == 1

        restarted = threading.Timer(6.0, stack.start_component, args=("s3",))
        began = time.monotonic()
        restarted.start()
        try:
            uploaded = upload(120.0)
        finally:
            restarted.join()
        assert time.monotonic() - began >= 6.0
        assert len(retries) >= 3  # it went on past its 2 attempts while S3 was down
        # refused connections, then whatever a starting SeaweedFS answers: all of them an outage
        assert all(unavailable_dependency(exc) == "object store" for exc in retries), retries
        manifest, digest = checkpoints.fetch_verified(prefix, tmp_path / "back", job_id=job)
        assert digest == uploaded.manifest_sha256 and (manifest.model_extra or {})["step"] == 8
