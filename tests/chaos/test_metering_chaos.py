"""Kill -9 the metering process at 20 random points of a replay: the final ledger equals
the ground truth, and usage.metered carries exactly one event per ledger line.

The service runs as it does in production (`python -m whetstone.metering`) on the real
embedded stack. The kill points are random thresholds of progress (events claimed in
the inbox), so they fall inside transactions, between a commit and the Kafka offset
commit, and between a commit and the outbox relay's publish."""

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from whetstone.metering.domain.usage import job_class_of
from whetstone.devstack.metering_sim import Invoice, Workload, generate
from whetstone.devstack.testing import consume_all

pytestmark = pytest.mark.chaos
KILLS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def produce(bootstrap: str, work: Workload) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, acks="all")
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(t, v, key=k) for t, k, v in work.messages])
    finally:
        await producer.stop()


async def scalar(conn: asyncpg.Connection, sql: str) -> int:
    try:
        return await conn.fetchval(sql) or 0
    except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
        return 0  # the service has not created its schema yet


async def progress(conn: asyncpg.Connection) -> dict[str, int]:
    """Where a replay stands: events handled, job lines written, what still waits."""
    return {"inbox": await scalar(conn, "SELECT count(*) FROM inbox"),
            "job_lines": await scalar(conn, "SELECT count(*) FROM ledger WHERE scope = 'job'"),
            "waiting_segments": await scalar(conn, "SELECT count(*) FROM segments WHERE waiting"),
            "open_anomalies": await scalar(conn, "SELECT count(*) FROM anomalies WHERE resolved_at IS NULL"),
            "unsent_outbox": await scalar(conn, "SELECT count(*) FROM outbox WHERE sent_at IS NULL")}


async def settled(conn: asyncpg.Connection, work: Workload) -> bool:
    now = await progress(conn)
    return (now["job_lines"] == len(work.jobs) and now["waiting_segments"] == 0
            and now["open_anomalies"] == len(work.anomalies) and now["unsent_outbox"] == 0)


async def invoices(conn: asyncpg.Connection) -> dict[str, Invoice]:
    rows = await conn.fetch("SELECT job_id, scope, segment_id, entry, charge_class, gpu_seconds, billable_gpu_seconds,"
                            " cost FROM ledger ORDER BY id")
    by_job: dict[str, list] = defaultdict(list)
    for r in rows:
        by_job[r["job_id"]].append(r)
    out = {}
    for job_id, lines in by_job.items():
        segs = [r for r in lines if r["scope"] == "segment"]
        current: dict[str, object] = {}
        for r in segs:
            current[r["segment_id"]] = r if r["entry"] == "charge" else None
        total = next(r for r in lines if r["scope"] == "job")
        out[job_id] = Invoice(sum(r["gpu_seconds"] for r in segs), sum(r["billable_gpu_seconds"] for r in segs),
                              sum(r["cost"] for r in segs),
                              job_class_of({r["charge_class"] for r in current.values() if r}, total["charge_class"]))
    return out


async def test_twenty_kills_during_a_replay_leave_the_ledger_equal_to_the_ground_truth(stack, tmp_path: Path):
    work = generate(2500, seed=11)
    await produce(stack.kafka_bootstrap, work)
    env = {**os.environ, **stack.as_env(), "WHETSTONE_DATA_DIR": str(tmp_path), "WHETSTONE_LOG_LEVEL": "WARNING",
           "WHETSTONE_METERING_HTTP_PORT": str(free_port()), "WHETSTONE_METERING_BATCH_SIZE": "20",
           "WHETSTONE_METERING_CLOSE_GRACE_S": "1", "WHETSTONE_METERING_ORPHAN_GRACE_S": "2",
           "WHETSTONE_METERING_SWEEP_INTERVAL_S": "0.3",
           # a killed member leaves no goodbye: let the group notice within 2 s, not the default 10 s
           "WHETSTONE_METERING_SESSION_TIMEOUT_MS": "2000"}
    log = (tmp_path / "metering.log").open("ab")

    def spawn() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "whetstone.metering"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)

    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": "metering"})
    rng = random.Random(2026)
    thresholds = sorted(rng.sample(range(50, work.unique_events), KILLS))
    kills = []
    try:
        for threshold in thresholds:
            proc = spawn()
            deadline = time.monotonic() + 60
            while await scalar(conn, "SELECT count(*) FROM inbox") < threshold:
                assert proc.poll() is None, f"metering died on its own; see {log.name}"
                assert time.monotonic() < deadline, f"no progress to {threshold} events"
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append(await scalar(conn, "SELECT count(*) FROM inbox"))
        proc = spawn()
        deadline = time.monotonic() + 120
        while not await settled(conn, work):
            assert proc.poll() is None and time.monotonic() < deadline, \
                f"the ledger did not settle: {await progress(conn)} (want {len(work.jobs)} job lines)"
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

        assert len(kills) == KILLS and kills[-1] < work.unique_events  # every kill fell inside the replay
        ledger = await invoices(conn)
        wrong = {j: (ledger.get(j), truth) for j, truth in work.invoices.items() if ledger.get(j) != truth}
        assert not wrong, list(wrong.items())[:3]
        lines = await conn.fetch("SELECT job_id, scope, segment_id, entry, revision, usage_event_id FROM ledger")
        published = [json.loads(v) for v in await consume_all(stack.kafka_bootstrap, "usage.metered", timeout=5)]
        by_key: dict[tuple, set[str]] = defaultdict(set)
        for e in published:
            p = e["payload"]
            by_key[(p["job_id"], p["scope"], p["segment_id"])].add(e["event_id"])
        # at-least-once delivery of the same event ids (a crash before the relay marks a row sent
        # re-publishes it); never two different events for one ledger line, never one missing
        assert all(len(ids) == 1 for ids in by_key.values())
        assert {i for ids in by_key.values() for i in ids} == {r["usage_event_id"] for r in lines}
        assert len(by_key) == len(lines)
    finally:
        await conn.close()
        log.close()
