"""A gang's faults through the six real services (issue 40 point 2): two trainer-agent processes, node-a
(rank 0) and node-b, each offering one CPU slot; a job that needs both (DDP over gloo).

1. node-b's agent is stopped mid-run (SIGTERM: a spot node reclaimed). Its SIGTERM stops both ranks after
   the same step; rank 0 writes the gang's ONE emergency checkpoint and node-a alone reports job.preempted
   with it (node-b's launcher exits non-zero on SIGTERM and reports nothing: a report of its own could
   re-queue the gang from an older checkpoint).
2. node-b comes back: the gang resumes both ranks from that emergency checkpoint.
3. node-b's agent is killed outright (SIGKILL) once the resumed attempt checkpointed: its launcher and rank
   die with it (PDEATHSIG); node-a's rank stops too (its collective with node-b broke: it reports node_lost;
   or the scheduler fences it when node-b's heartbeat times out), the scheduler declares node-b lost, and the
   gang waits in the queue (node-b's last heartbeat reported its slot busy: nothing is placed there) with the
   loss counted against the job's node-loss bound. Nothing of that attempt runs or checkpoints afterwards.
4. node-b's agent comes back: the gang trains again on both nodes from the attempt's last checkpoint.
5. the job is cancelled mid-run: it ends once, and nothing is left running on either node.

A rank hung in a collective is services/trainer-agent/tests/integration/test_gang_hang.py (two real gloo
processes, the recipe's own group join and timeout); the scheduler's side of a lost node (every node of the
gang fenced, the gang re-queued, the re-queues bounded) is services/scheduler/tests/unit/test_gang.py."""

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest
from whetstone.cli.dev import core_service_builders, upstreams_of
from whetstone.devstack.multinode import create_gang_job, processes_naming, sample_rows, start_agent, stop_agent
from whetstone.devstack.testing import until
from whetstone.modelkit.tiny import build_tiny_model

pytestmark = pytest.mark.integration
# 16 rows / (2 ranks x 2) = 4 steps an epoch, 12 in all; a checkpoint every 2 steps
HP = {"n_epochs": 3, "batch_size": 2, "max_seq_len": 48, "lora_r": 4, "seed": 0, "checkpoint_every_steps": 2,
      "lora_dropout": 0.0}
AGENT = {"WHETSTONE_TRAINER_AGENT_ADDRESS": "127.0.0.1", "WHETSTONE_TRAINER_AGENT_PROGRESS_INTERVAL_S": "0.01",
         "WHETSTONE_TRAINER_AGENT_HEARTBEAT_S": "0.5", "WHETSTONE_TRAINER_AGENT_COLLECTIVE_TIMEOUT_S": "60",
         # rank 0's torchrun waits at its exit barrier for the stopped node's launcher: do not hold the slot long
         "WHETSTONE_TRAINER_AGENT_EXIT_GRACE_S": "5"}


def faults(**kinds: object) -> dict[str, str]:
    return {**AGENT, "WHETSTONE_RECIPE_FAULTS": json.dumps(kinds)}


def without_agent() -> list:
    return [b for b in core_service_builders() if not b.__module__.startswith("whetstone.trainer_agent")]


async def published(conn: asyncpg.Connection, topic: str, job_id: str) -> list[dict]:
    """What both agents published on `topic` about the job (they share the trainer_agent schema's outbox)."""
    rows = await conn.fetch("SELECT value FROM trainer_agent.outbox WHERE topic = $1 ORDER BY id", topic)
    return [p for p in (json.loads(bytes(r["value"]))["payload"] for r in rows) if p["job_id"] == job_id]


async def runs_of(conn: asyncpg.Connection, job_id: str, attempt: int) -> dict[str, asyncpg.Record]:
    return {r["node_id"]: r for r in await conn.fetch(
        "SELECT node_id, status, outcome, resume_from ->> 'uri' AS resume_uri FROM trainer_agent.runs"
        " WHERE job_id = $1 AND attempt = $2", job_id, attempt)}


async def test_a_stopped_gang_node_leaves_one_emergency_checkpoint_and_the_gang_resumes_from_it(platform, settings, openai_clients, monkeypatch,
                                                                  tmp_path):
    monkeypatch.setenv("WHETSTONE_EVAL_TIERS_MAY_SKIP_SAFETY", '["standard"]')
    # a killed agent's node is declared lost 20 s after its last heartbeat (every 0.5 s here): well past a busy
    # agent's pause under load, and past rank 0's emergency checkpoint once a drained node-b went silent (1.)
    monkeypatch.setenv("WHETSTONE_SCHEDULER_NODE_TIMEOUT_S", "20")
    monkeypatch.setenv("WHETSTONE_SCHEDULER_LOST_NODE_CHECK_S", "1")
    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    logs = {n: tmp_path / f"{n}.log" for n in ("node-a", "node-b")}
    node_a = start_agent("node-a", logs["node-a"], AGENT)
    node_b = start_agent("node-b", logs["node-b"], faults(forward_delay_s=0.5))   # slow: stopped mid-run
    try:
        async with platform(*without_agent()) as p, openai_clients(upstreams_of(p.runtimes.values())) as (
                client, _):
            conn = await asyncpg.connect(settings.database_url)
            try:
                job = await create_gang_job(conn, client, sample_rows(16), HP)

                # 1. node-b stopped mid-run: one emergency checkpoint, one job.preempted, both from rank 0
                def attempt_1_checkpointed(cks: list[dict]) -> bool:
                    assert node_a.poll() is None and node_b.poll() is None, logs["node-b"].read_text()[-3000:]
                    return any(c["attempt"] == 1 and c["kind"] == "periodic" for c in cks)
                await until(lambda: published(conn, "checkpoint.written", job.id), attempt_1_checkpointed, 240,
                            "attempt 1's first periodic checkpoint")
                assert await asyncio.to_thread(stop_agent, node_b) == 0, logs["node-b"].read_text()[-3000:]
                stops = await until(lambda: published(conn, "job.preempted", job.id),
                                    lambda ps: any(x["attempt"] == 1 for x in ps), 120, "attempt 1 preempted")
                emergency = [c for c in await published(conn, "checkpoint.written", job.id)
                             if c["attempt"] == 1 and c["kind"] == "emergency"]
                assert len(emergency) == 1, emergency
                assert [(x["node_id"], x["checkpoint"]["uri"]) for x in stops if x["attempt"] == 1] == [
                    ("node-a", emergency[0]["uri"])], stops
                first = await until(lambda: runs_of(conn, job.id, 1),
                                    lambda rs: all(r["outcome"] for r in rs.values()) and len(rs) == 2, 60,
                                    "attempt 1 ended on both nodes")
                # node-b's rank ended on its own (worker_done) or was fenced by node-a's report first; either
                # way it reported nothing (above: the one job.preempted is node-a's)
                assert first["node-b"]["outcome"] in ("worker_done", "fenced"), dict(first["node-b"])
                assert not await published(conn, "job.failed", job.id)

                # 2. node-b comes back: the gang resumes both ranks from that emergency checkpoint, as attempt 2:
                # nothing was placed on node-b while it drained or before its new agent reported its slot free
                # (its heartbeats said draining, and busy before that), so no attempt was handed back
                node_b = start_agent("node-b", logs["node-b"], faults(forward_delay_s=1.0))   # still mid-run at 3.
                starts = await until(lambda: published(conn, "job.started", job.id),
                                     lambda ss: any(s["attempt"] > 1 for s in ss), 300, "the gang resumed")
                resumed = min((s for s in starts if s["attempt"] > 1), key=lambda s: s["attempt"])
                assert (resumed["node_id"], resumed["resumed_from_step"]) == ("node-a", emergency[0]["step"]), starts
                assert resumed["attempt"] == 2, starts
                second = await runs_of(conn, job.id, resumed["attempt"])
                assert {n: r["resume_uri"] for n, r in second.items()} == {
                    "node-a": emergency[0]["uri"], "node-b": emergency[0]["uri"]}, second

                # 3. node-b's agent killed outright once the resumed attempt has a checkpoint of its own
                k = resumed["attempt"]
                await until(lambda: published(conn, "checkpoint.written", job.id),
                            lambda cks: any(c["attempt"] == k and c["kind"] == "periodic" for c in cks), 120,
                            f"attempt {k}'s first periodic checkpoint")
                node_b.kill()
                assert await asyncio.to_thread(node_b.wait) == -9
                third = await until(lambda: runs_of(conn, job.id, k), lambda rs: rs["node-a"]["outcome"] is not None,
                                    90, f"attempt {k} stopped on node-a")
                # node-a reported node_lost (its collective with node-b broke) or was fenced by the scheduler
                assert third["node-a"]["outcome"] in ("preempted", "fenced"), dict(third["node-a"])
                assert third["node-b"]["status"] == "running"     # its agent died: its successor recovers it
                await until(lambda: conn.fetchval("SELECT lost FROM scheduler.nodes WHERE node_id = 'node-b'"),
                            bool, 60, "node-b declared lost (heartbeat timeout)")
                assert not processes_naming(f"{job.id}-s{k}"), "a rank of the stopped attempt is still running"
                row = await conn.fetchrow("SELECT status, attempt, node_ids, node_losses, lost_nodes FROM"
                                          " scheduler.jobs WHERE job_id = $1", job.id)
                assert (row["status"], row["attempt"], row["node_ids"]) == ("queued", k, []), dict(row)  # waits
                assert row["node_losses"] >= 1 and row["lost_nodes"] == ["node-b"], dict(row)
                checkpoints = await published(conn, "checkpoint.written", job.id)
                last = max((c for c in checkpoints if c["kind"] != "final"), key=lambda c: c["step"])
                assert last["attempt"] == k, last

                # 4. node-b's agent back: the gang trains again on both nodes from that attempt's last checkpoint
                node_b = start_agent("node-b", logs["node-b"], faults(forward_delay_s=1.0))
                starts = await until(lambda: published(conn, "job.started", job.id),
                                     lambda ss: any(s["attempt"] > k for s in ss), 180, "the gang trained again")
                again = min((s for s in starts if s["attempt"] > k), key=lambda s: s["attempt"])
                assert (again["node_id"], again["resumed_from_step"], again["attempt"]) == (
                    "node-a", last["step"], k + 1), starts   # nothing was placed on node-b while it was gone
                fourth = await runs_of(conn, job.id, again["attempt"])
                assert {n: r["resume_uri"] for n, r in fourth.items()} == {
                    "node-a": last["uri"], "node-b": last["uri"]}, fourth
                assert (await runs_of(conn, job.id, k))["node-b"]["status"] != "running"   # recovered
                # nothing of the stopped attempt was published after it stopped
                assert [c for c in await published(conn, "checkpoint.written", job.id) if c["attempt"] == k] == [
                    c for c in checkpoints if c["attempt"] == k]

                # 5. cancelled mid-run: the job ends once, nothing left running on either node
                await client.fine_tuning.jobs.cancel(job.id)
                await until(lambda: client.fine_tuning.jobs.retrieve(job.id), lambda j: j.status == "cancelled", 60,
                            "job cancelled")
                await until(lambda: conn.fetch("SELECT node_id, attempt, status FROM trainer_agent.runs"
                                               " WHERE job_id = $1 AND status IN ('assigned', 'running')", job.id),
                            lambda rs: not rs, 90, "no run of the job left on a node")
                assert not await published(conn, "job.completed", job.id)
                assert {f["code"] for f in await published(conn, "job.failed", job.id)} <= {"cancelled"}
                assert (await client.fine_tuning.jobs.retrieve(job.id)).status == "cancelled"
            finally:
                await conn.close()
    finally:
        for proc in (node_a, node_b):
            await asyncio.to_thread(stop_agent, proc, 30)
    assert not processes_naming(job.id), "a training process of the job outlived the test"
