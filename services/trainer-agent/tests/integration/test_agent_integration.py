"""The trainer agent on the real embedded stack (Kafka, Postgres, SeaweedFS) running the real
recipe on the tiny Llama: checkpoints in S3 with manifests and retention, drain with an
emergency checkpoint, resume falling back from a corrupt checkpoint, cancel, crashes, an
agent killed outright, and a segment fenced by the scheduler."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from whetstone.contracts import (
    CheckpointRef,
    JobAssignedV1,
    JobCancelledV1,
    NodeFencedV1,
    TrainingSpec,
)
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.runtime.models import resolve_model
from whetstone.runtime.s3 import ObjectStore
from whetstone.trainer_agent.adapters.checkpoint_store import S3Checkpoints
from whetstone.trainer_agent.bootstrap import build_service
from whetstone.trainer_agent.config import TrainerAgentSettings

pytestmark = pytest.mark.integration

NODE = "node-a"
TENANT = "demo"
TRAIN_KEY = f"tenants/{TENANT}/datasets/ds-x/train.jsonl"


# --------------------------------------------------------------------------- helpers


def agent(node: str = NODE, **overrides: Any):
    config = TrainerAgentSettings(node_id=node, heartbeat_s=0.3, progress_interval_s=0.2, **overrides)
    return lambda: build_service(config)


def install_model(settings, tiny_base: Path, name: str = "tiny-llama") -> str:
    target = settings.model_catalog / name
    if not target.exists():
        shutil.copytree(tiny_base, target)
    return resolve_model(name, settings.model_catalog).sha256


def chat_rows(n: int) -> bytes:
    rows = [{"messages": [{"role": "user", "content": f"hi {i}"},
                          {"role": "assistant", "content": f"hello number {i}"}]} for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def spec(sha: str, train_uri: str, model: str = "tiny-llama", **hyper: Any) -> TrainingSpec:
    hp = {"n_epochs": 1, "batch_size": 8, "max_seq_len": 64, "learning_rate": 1e-2, "seed": 0, **hyper}
    return TrainingSpec(base_model=model, base_model_sha256=sha, dataset_id="ds-x", dataset_version="v1",
                        train_uri=train_uri, method="lora", hyperparameters=hp, hyperparameters_hash="h")


async def assign(settings, job_id: str, spec_: TrainingSpec, *, attempt: int = 1, node: str = NODE,
                 resume_from: CheckpointRef | None = None, extra_payload: dict | None = None) -> str:
    segment_id = f"{job_id}-s{attempt}"
    event = JobAssignedV1(job_id=job_id, node_id=node, segment_id=segment_id, attempt=attempt, gpu_ids=[0],
                          spec=spec_, resume_from=resume_from)
    fields = {"payload": {**event.model_dump(mode="json"), **extra_payload}} if extra_payload else {}
    await send_event(settings.kafka_bootstrap, event, TENANT, **fields)
    return segment_id


async def events(rt, topic: str, job_id: str | None = None) -> list[dict]:
    return [e["payload"] for e in await outbox(rt, topic) if job_id is None or e["payload"].get("job_id") == job_id]


async def wait_event(rt, topic: str, job_id: str, check=lambda e: True, timeout: float = 180) -> dict:
    async def found():
        return next((e for e in await events(rt, topic, job_id) if check(e)), None)
    return await wait_until(found, timeout=timeout, what=f"{topic} for {job_id}")


async def terminal(rt, job_id: str, timeout: float = 180) -> tuple[str, dict]:
    async def found():
        for topic in ("job.completed", "job.failed", "job.preempted"):
            if hits := await events(rt, topic, job_id):
                return topic, hits[0]
        return None
    return await wait_until(found, timeout=timeout, what=f"terminal event for {job_id}")


def stored(store, job_id: str) -> list[tuple[int, str]]:
    return [(c.step, c.kind) for c in S3Checkpoints(store).list_job(TENANT, job_id)]


# --------------------------------------------------------------------------- tests


async def test_agent_trains_checkpoints_prunes_and_reports_capacity(platform, settings, tiny_base, tmp_path,
                                                                   monkeypatch):
    sha = install_model(settings, tiny_base)
    # the job is pinned to the trainer image this node says it runs (the same digest under another name)
    image_digest = "sha256:" + "5" * 64
    monkeypatch.setenv("WHETSTONE_IMAGE_DIGEST", f"registry.local:5000/trainer@{image_digest}")
    async with platform(agent(keep_checkpoints=2)) as p:
        rt = p["trainer-agent"]
        uri = rt.store.put_bytes(TRAIN_KEY, chat_rows(16))
        pinned = spec(sha, uri, n_epochs=2, checkpoint_every_steps=1).model_copy(
            update={"image": f"ghcr.io/whetstone/trainer@{image_digest}"})
        segment = await assign(settings, "job-ok", pinned)

        async def busy_heartbeat():
            return [h for h in await events(rt, "node.heartbeat") if "job-ok" in h["running_jobs"]]
        beat = (await wait_until(busy_heartbeat, timeout=60, what="heartbeat with the job"))[0]
        assert beat["free_gpu_ids"] == [] and beat["node_id"] == NODE

        topic, done = await terminal(rt, "job-ok")
        assert topic == "job.completed", done
        started = (await events(rt, "job.started", "job-ok"))[0]
        assert started["segment_id"] == segment and started["total_steps"] == 4
        assert await events(rt, "job.progress", "job-ok")

        written = await events(rt, "checkpoint.written", "job-ok")
        assert [(w["step"], w["kind"]) for w in written] == [(1, "periodic"), (2, "periodic"), (3, "periodic"),
                                                             (4, "final")]
        assert done["final_checkpoint"]["uri"] == written[-1]["uri"] and done["steps"] == 4
        # fencing: every event of the segment names its attempt, the checkpoint names carry it too
        assert done["attempt"] == 1 and {w["attempt"] for w in written} == {1}
        assert {e["attempt"] for e in await events(rt, "job.progress", "job-ok")} == {1}
        assert all(w["uri"].endswith("-a1") for w in written)
        # keep the last 2 resumable checkpoints (pruned only after the newer manifest was stored), and the final
        assert stored(rt.store, "job-ok") == [(2, "periodic"), (3, "periodic"), (4, "final")]
        for w in written[1:]:
            prefix = w["uri"].split("/", 3)[3]
            _, digest = S3Checkpoints(rt.store).fetch_verified(prefix, tmp_path / "check" / str(w["step"]),
                                                               job_id="job-ok")
            assert digest == w["manifest_sha256"] and w["files"] > 0 and w["size_bytes"] > 0
        # the training child's lockfile records the image digest it ran in: the one the job pinned
        lock = json.loads((tmp_path / "check" / "4" / "environment.lock.json").read_text())
        assert lock["image_digest"] == f"registry.local:5000/trainer@{image_digest}", lock

        async def idle_heartbeat():
            beats = await events(rt, "node.heartbeat")
            return beats and beats[-1]["free_gpu_ids"] == [0] and beats[-1]["running_jobs"] == []
        # the segment ends when its process has exited after its last event (interpreter teardown: seconds)
        await wait_until(idle_heartbeat, timeout=60, what="idle heartbeat")
        assert not (settings.data_dir / "scratch" / NODE / segment).exists()  # local scratch cleaned


async def test_agent_drain_then_resume_falls_back_from_a_corrupt_checkpoint(platform, settings, tiny_base):
    sha = install_model(settings, tiny_base)
    # --- segment 1: the agent is stopped (node drain) mid-run: emergency checkpoint, job.preempted
    async with platform(agent(keep_checkpoints=2)) as p:
        rt = p["trainer-agent"]
        job_spec = spec(sha, rt.store.put_bytes(TRAIN_KEY, chat_rows(16)), n_epochs=4, batch_size=1,
                        checkpoint_every_steps=10)
        await assign(settings, "job-d", job_spec)
        first = await wait_event(rt, "checkpoint.written", "job-d")
        assert (first["step"], first["kind"]) == (10, "periodic")
    # leaving the block stopped the agent: drain SIGTERMed the recipe and waited for its emergency checkpoint
    async with platform(agent(keep_checkpoints=2)) as p:
        rt = p["trainer-agent"]
        preempted = (await events(rt, "job.preempted", "job-d"))[0]
        emergency = [w for w in await events(rt, "checkpoint.written", "job-d") if w["kind"] == "emergency"]
        assert len(emergency) == 1 and emergency[0]["step"] > 10
        assert preempted["reason"] == "drain" and preempted["attempt"] == 1
        assert preempted["checkpoint"] == {k: emergency[0][k] for k in ("uri", "step", "manifest_sha256")}
        assert not await events(rt, "job.failed", "job-d")

        # --- corrupt the emergency checkpoint in SeaweedFS (its manifest is intact, a file is not)
        prefix = emergency[0]["uri"].split("/", 3)[3]
        victim = next(k for k in rt.store.list_keys(prefix + "/") if k.endswith(".safetensors"))
        rt.store.put_bytes(victim, b"not the adapter any more")
        periodic = [w for w in await events(rt, "checkpoint.written", "job-d") if w["kind"] == "periodic"]
        fallback = max(periodic, key=lambda w: w["step"])

        # --- segment 2 resumes: the corrupt checkpoint is skipped for the newest older durable one
        await assign(settings, "job-d", job_spec, attempt=2, resume_from=CheckpointRef(**preempted["checkpoint"]))
        started = await wait_event(rt, "job.started", "job-d", lambda e: e["segment_id"] == "job-d-s2")
        assert started["resumed_from_step"] == fallback["step"]
        _, done = await _completed(rt, "job-d")
        assert done["steps"] == 64 and done["attempt"] == 2
        # retention: the last 2 resumable + the one segment 2 resumed from + final; the corrupt one is gone
        left = stored(rt.store, "job-d")
        assert (fallback["step"], "periodic") in left and (64, "final") in left
        assert (emergency[0]["step"], "emergency") not in left
        assert len([c for c in left if c[1] != "final"]) == 3


async def _completed(rt, job_id: str) -> tuple[str, dict]:
    async def found():
        hits = await events(rt, "job.completed", job_id)
        failed = await events(rt, "job.failed", job_id)
        assert not failed, failed
        return ("job.completed", hits[0]) if hits else None
    return await wait_until(found, timeout=240, what=f"job.completed for {job_id}")


async def test_agent_reports_cancel_crash_recipe_failure_and_rejected_plans(platform, settings, tiny_base,
                                                                          monkeypatch):
    monkeypatch.delenv("WHETSTONE_IMAGE_DIGEST", raising=False)
    monkeypatch.delenv("IMAGE_DIGEST", raising=False)
    sha = install_model(settings, tiny_base)
    broken = settings.model_catalog / "tiny-no-tokenizer"      # same weights, so the pin matches
    shutil.copytree(tiny_base, broken)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (broken / name).unlink(missing_ok=True)
    async with platform(agent()) as p:
        rt = p["trainer-agent"]
        uri = rt.store.put_bytes(TRAIN_KEY, chat_rows(16))
        long_run = {"n_epochs": 20, "batch_size": 1, "checkpoint_every_steps": 1000}
        await assign(settings, "job-cancel", spec(sha, uri, **long_run))
        await assign(settings, "job-kill", spec(sha, uri, **long_run))
        await assign(settings, "job-broken", spec(sha, uri, model="tiny-no-tokenizer"))
        await assign(settings, "job-zero7", spec(sha, uri, zero_stage=7))
        pin = "ghcr.io/whetstone/trainer@sha256:" + "9" * 64
        await assign(settings, "job-image", spec(sha, uri).model_copy(update={"image": pin}))

        # a job pinned to a trainer image this node cannot show it runs: refused before anything is fetched
        topic, mismatched = await terminal(rt, "job-image")
        assert (topic, mismatched["code"]) == ("job.failed", "image_mismatch"), mismatched
        assert pin in mismatched["message"] and "WHETSTONE_IMAGE_DIGEST" in mismatched["message"], mismatched

        # a plan no rule allows is rejected before anything runs, as the user's error
        topic, rejected = await terminal(rt, "job-zero7")
        assert (topic, rejected["error_class"], rejected["code"]) == ("job.failed", "user",
                                                                      "invalid_distributed_config")
        assert "zero_stage" in rejected["message"]

        # the recipe itself reports its failure: passed through, not mistaken for a crash
        topic, broken_failed = await terminal(rt, "job-broken")
        assert topic == "job.failed" and broken_failed["code"] != "trainer_crashed"
        assert broken_failed["error_class"] in ("platform", "user")

        await wait_event(rt, "job.progress", "job-cancel")
        await wait_event(rt, "job.progress", "job-kill")
        segments = rt.ctx.node.segments
        killed_pid = segments["job-kill-s1"].proc.pid
        cancelled_pid = segments["job-cancel-s1"].proc.pid
        # least privilege (issue 35 p5): the running child holds none of the agent's credentials, and
        # with what it holds the object store refuses it another tenant's object
        child_env = _environ(cancelled_pid)
        assert child_env.get("HF_HUB_OFFLINE") == "1"          # it is the child's real environment
        _assert_no_credentials(child_env, settings)
        other = rt.store.put_bytes("tenants/acme/datasets/ds-secret/train.jsonl", b'{"secret": 1}\n')
        assert rt.store.get_bytes(other) == b'{"secret": 1}\n'   # the agent's own credentials can (the control)
        assert _read_as_child(child_env, settings, "tenants/acme/datasets/ds-secret/train.jsonl") == \
            ["no-credentials", "refused AccessDenied"]

        # a training process killed outright: platform failure with the log tail, never silence
        os.killpg(killed_pid, signal.SIGKILL)
        topic, crash = await terminal(rt, "job-kill")
        assert (topic, crash["error_class"], crash["code"]) == ("job.failed", "platform", "trainer_crashed")
        assert "killed by SIGKILL" in crash["message"] and "log tail" in crash["message"]

        # cancel: the group killed at once, reported as the user's failure (metering closes the segment)
        await send_event(settings.kafka_bootstrap, JobCancelledV1(job_id="job-cancel", node_id=NODE), TENANT)
        topic, cancelled = await terminal(rt, "job-cancel")
        assert (topic, cancelled["error_class"], cancelled["code"]) == ("job.failed", "user", "cancelled")
        assert not await events(rt, "job.preempted", "job-cancel")
        assert not await events(rt, "checkpoint.written", "job-cancel")   # no emergency upload for a cancel
        for pid in (killed_pid, cancelled_pid):
            await wait_until(lambda pid=pid: _gone(pid), timeout=15, what=f"process group {pid} gone")
        await wait_until(lambda: _no_segments(rt), timeout=15, what="segments finished")


CREDENTIAL_SETTINGS = ("WHETSTONE_DATABASE_URL", "WHETSTONE_S3_ACCESS_KEY", "WHETSTONE_S3_SECRET_KEY",
                       "WHETSTONE_KAFKA_BOOTSTRAP", "WHETSTONE_INTERNAL_SECRET", "WHETSTONE_KAFKA_SASL_PASSWORD")
READ_AS_CHILD = """
import sys, boto3, botocore
from botocore.config import Config
endpoint, bucket, key = sys.argv[1:4]
for config in (Config(), Config(signature_version=botocore.UNSIGNED)):   # what it was given, then nothing
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)
    try:
        s3.get_object(Bucket=bucket, Key=key)
        print("read")
    except botocore.exceptions.NoCredentialsError:
        print("no-credentials")
    except botocore.exceptions.ClientError as exc:
        print("refused", exc.response["Error"]["Code"])
"""


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _assert_no_credentials(child_env: dict[str, str], settings) -> None:
    leaked = sorted(k for k in child_env if k.startswith(("WHETSTONE_DATABASE", "WHETSTONE_KAFKA", "WHETSTONE_S3",
                                                           "WHETSTONE_INTERNAL", "AWS_")))
    assert not leaked, f"the training child holds the agent's credentials: {leaked}"
    secrets = {os.environ[k] for k in CREDENTIAL_SETTINGS if os.environ.get(k)} | {settings.s3_secret_key}
    assert not secrets & set(child_env.values())


def _read_as_child(child_env: dict[str, str], settings, key: str) -> list[str]:
    """Another tenant's object read with exactly the child's environment (the endpoint handed to it)."""
    env = {**child_env, "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
           "AWS_EC2_METADATA_DISABLED": "true"}
    out = subprocess.run([sys.executable, "-c", READ_AS_CHILD, settings.s3_endpoint, settings.bucket, key],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split("\n")[:-1]


async def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _no_segments(rt) -> bool:
    return not rt.ctx.node.segments


async def test_agent_killed_outright_is_reported_preempted_by_its_successor(platform, settings, tiny_base, tmp_path):
    """SIGKILL the agent process: its training process dies with it (PDEATHSIG); the restarted
    agent reports the segment preempted (node_lost) from the last durable checkpoint."""
    sha = install_model(settings, tiny_base)
    node = "node-lost"
    env = {**os.environ, "WHETSTONE_TRAINER_AGENT_NODE_ID": node, "WHETSTONE_TRAINER_AGENT_HTTP_PORT": "0"}
    log = open(tmp_path / "agent.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "whetstone.trainer_agent"], env=env, stdout=log, stderr=log)
    try:
        store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
        uri = store.put_bytes(TRAIN_KEY, chat_rows(16))
        await assign(settings, "job-lost", spec(sha, uri, n_epochs=10, batch_size=1, checkpoint_every_steps=10),
                     node=node)
        conn = await asyncpg.connect(settings.database_url)
        try:
            async def first_checkpoint():
                assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
                try:
                    rows = await conn.fetch("SELECT value FROM trainer_agent.outbox"
                                            " WHERE topic = 'checkpoint.written'")
                except asyncpg.UndefinedTableError:   # the agent has not migrated its schema yet
                    return None
                return [json.loads(bytes(r["value"]))["payload"] for r in rows]
            written = (await wait_until(first_checkpoint, timeout=180, what="first checkpoint"))[0]
            child = await conn.fetchval("SELECT pid FROM trainer_agent.runs WHERE job_id = 'job-lost'")
        finally:
            await conn.close()
        proc.kill()                                     # the node is lost: no drain, no goodbye
        proc.wait(timeout=10)
        await wait_until(lambda: _gone(child), timeout=15, what="training process died with its agent")
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    async with platform(agent(node=node)) as p:
        rt = p["trainer-agent"]
        preempted = await wait_event(rt, "job.preempted", "job-lost", timeout=30)
        assert preempted["reason"] == "node_lost" and preempted["node_id"] == node
        # the latest durable checkpoint the dead agent published (a later one may have landed before the kill)
        latest = max((w for w in await events(rt, "checkpoint.written", "job-lost")), key=lambda w: w["step"])
        assert latest["step"] >= written["step"]
        assert preempted["checkpoint"] == {k: latest[k] for k in ("uri", "step", "manifest_sha256")}
        assert not await events(rt, "job.failed", "job-lost")


async def test_agent_preempts_a_running_job_on_the_schedulers_command(platform, settings, tiny_base):
    from whetstone.contracts import JobPreemptRequestedV1

    sha = install_model(settings, tiny_base)
    async with platform(agent()) as p:
        rt = p["trainer-agent"]
        uri = rt.store.put_bytes(TRAIN_KEY, chat_rows(16))
        segment = await assign(settings, "job-prio", spec(sha, uri, n_epochs=20, batch_size=1,
                                                          checkpoint_every_steps=1000))
        await wait_event(rt, "job.progress", "job-prio")
        # a command for another node is not ours
        await send_event(settings.kafka_bootstrap, JobPreemptRequestedV1(
            job_id="job-prio", node_id="node-b", reason="priority"), TENANT)
        await send_event(settings.kafka_bootstrap, JobPreemptRequestedV1(
            job_id="job-prio", node_id=NODE, segment_id=segment, reason="priority", for_job_id="job-vip"), TENANT)
        topic, stopped = await terminal(rt, "job-prio")
        assert topic == "job.preempted" and stopped["reason"] == "priority"
        emergency = await wait_event(rt, "checkpoint.written", "job-prio", lambda e: e["kind"] == "emergency")
        assert stopped["checkpoint"]["uri"] == emergency["uri"]


async def test_agent_obeys_node_fenced_silently_and_only_for_its_own_attempt(platform, settings, tiny_base):
    """The scheduler declared this node lost and moved the job to a newer attempt: the running
    process group is killed at once, nothing more is reported for it, the run is recorded fenced.
    Fences for another node or for attempts not run here change nothing; redelivery neither."""
    sha = install_model(settings, tiny_base)
    bootstrap = settings.kafka_bootstrap
    async with platform(agent()) as p:
        rt = p["trainer-agent"]
        uri = rt.store.put_bytes(TRAIN_KEY, chat_rows(16))
        segment = await assign(settings, "job-fenced", spec(sha, uri, n_epochs=20, batch_size=1,
                                                            checkpoint_every_steps=1000), attempt=2)

        async def child():   # the real training process, maybe still importing: the fence must kill it
            seg = rt.ctx.node.segments.get(segment)
            return seg.proc.pid if seg is not None and seg.proc is not None else None
        pid = await wait_until(child, timeout=120, what="training process started")

        async def processed(*envs):
            rows = await rt.pool.fetchval("SELECT count(*) FROM inbox WHERE message_id = ANY($1::text[])",
                                          [str(e.event_id) for e in envs])
            return rows == len(envs)

        def fence(**fields):
            fields = {"job_id": "job-fenced", "node_id": NODE, "segment_id": segment, "attempt": 2,
                      "reason": "node_lost", **fields}
            return send_event(bootstrap, NodeFencedV1(**fields), TENANT)

        not_ours = [await fence(node_id="node-b"), await fence(attempt=1, segment_id="job-fenced-s1"),
                    await fence(attempt=3, segment_id=None), await fence(job_id="job-other")]
        await wait_until(lambda: processed(*not_ours), timeout=60, what="the other fences consumed")
        assert not await _gone(pid) and segment in rt.ctx.node.segments
        assert await rt.pool.fetchval("SELECT status FROM runs WHERE segment_id = $1", segment) == "running"

        fenced = await send_event(bootstrap, NodeFencedV1(job_id="job-fenced", node_id=NODE, segment_id=segment,
                                                          attempt=2, reason="node_lost"), TENANT, times=2)
        await wait_until(lambda: _gone(pid), timeout=15, what="fenced process group killed")
        await wait_until(lambda: _no_segments(rt), timeout=15, what="fenced segment finished")
        again = await fence()                                   # the same command once more: no effect
        await wait_until(lambda: processed(fenced, again), timeout=60, what="the fences consumed")

        row = await rt.pool.fetchrow("SELECT status, outcome FROM runs WHERE segment_id = $1", segment)
        assert (row["status"], row["outcome"]) == ("finished", "fenced")
        for topic in ("job.completed", "job.failed", "job.preempted", "checkpoint.written"):
            assert not await events(rt, topic, "job-fenced"), topic
        assert not rt.ctx.node.fenced                           # nothing left behind in memory

        # the fence heard before its assignment (another topic: no order between them): never run
        early = await fence(job_id="job-early", segment_id=None, attempt=1)
        await wait_until(lambda: processed(early), timeout=60, what="the early fence consumed")
        late = await assign(settings, "job-early", spec(sha, uri), attempt=1)

        async def recorded():
            return await rt.pool.fetchrow("SELECT status, outcome FROM runs WHERE segment_id = $1", late)
        row = await wait_until(recorded, timeout=60, what="the late assignment recorded")
        assert (row["status"], row["outcome"]) == ("finished", "fenced")
        assert late not in rt.ctx.node.segments
        for topic in ("job.started", "job.completed", "job.failed", "job.preempted"):
            assert not await events(rt, topic, "job-early"), topic


async def test_a_restarted_supervising_task_leaves_its_own_live_segments_alone(platform, settings, tiny_base):
    """The supervising task restarts when its database goes away for a moment (chaos: a PostgreSQL
    restart). Its recovery of a dead agent's runs must not take this agent's own live segment for
    one: before the fix it killed the training process and the job failed `trainer_crashed`."""
    from whetstone.trainer_agent.entrypoints.loops import recover_interrupted

    sha = install_model(settings, tiny_base)
    async with platform(agent()) as p:
        rt = p["trainer-agent"]
        uri = rt.store.put_bytes(TRAIN_KEY, chat_rows(16))
        segment = await assign(settings, "job-alive", spec(sha, uri, n_epochs=3, batch_size=1,
                                                           checkpoint_every_steps=1000))
        await wait_event(rt, "job.progress", "job-alive")
        pid = rt.ctx.node.segments[segment].proc.pid
        await recover_interrupted(rt)                        # what a restarted `supervise` runs first
        assert not await _gone(pid), "the agent killed its own training process"
        assert await rt.pool.fetchval("SELECT status FROM runs WHERE segment_id = $1", segment) == "running"
        topic, _ = await terminal(rt, "job-alive")
        assert topic == "job.completed"
        assert not await events(rt, "job.preempted", "job-alive")


async def test_the_agent_forgets_cancels_and_fences_kept_past_the_inbox_retention(platform, settings):
    settings.retention_interval_s = 0.2
    async with platform(agent()) as p:
        rt = p["trainer-agent"]
        async with rt.pool.acquire() as conn:
            for job, age in (("job-old", "15 days"), ("job-new", "1 day")):
                await conn.execute("INSERT INTO cancelled_jobs (job_id, tenant_id, cancelled_at)"
                                   f" VALUES ($1, $2, now() - interval '{age}')", job, TENANT)
                await conn.execute("INSERT INTO fenced_attempts (job_id, node_id, attempt, fenced_at)"
                                   f" VALUES ($1, $2, 1, now() - interval '{age}')", job, NODE)

        async def forgotten():
            left = await rt.pool.fetchval("SELECT array_agg(job_id) FROM (SELECT job_id FROM cancelled_jobs"
                                          " UNION ALL SELECT job_id FROM fenced_attempts) t")
            return left == ["job-new", "job-new"]
        await wait_until(forgotten, timeout=30, what="the old cancel and fence forgotten")
