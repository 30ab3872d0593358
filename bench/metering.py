"""Metering benchmark: a lifecycle workload with duplicates, replayed three times through
the real broker and Postgres, compared with the generator's ground truth.

1. generate N lifecycle events (default 1,000,000; ~8.7 per job, preemptions, failures of
   every class, cancellations, bad input, 10% duplicates, starts sent after their stops);
2. produce them once to the embedded Kafka;
3. replay 1: the metering service (a subprocess, `python -m whetstone.metering`) consumes
   them from offset 0 into an empty database;
4. replay 2: its consumer group is rewound to offset 0 and it consumes everything again
   into the same database (exactly once: the ledger must not change);
5. replay 3: its schema is dropped and it consumes from offset 0 again (the invoices
   must come out identical, whatever the interleaving of the topics this time).

The service runs as `--replicas` processes (default 2, as deploy/base runs it) of one consumer group,
which split the topics' partitions (metering assigns them by range, so a replica owns whole jobs);
every replica's CPU is counted. After each replay the per-job invoices (net of corrections) are compared with the
ground truth. events_per_s is the slowest replay's rate (messages consumed, ledger
settled, from the moment the service is up). A baseline in the same run: the service
consuming one message per transaction (no batching) on a smaller sample, and the
batched service on that same sample. On a shared machine the rates depend on what else
runs: each replay also reports the CPU microseconds per message of the service process, of
its Postgres backends, of the rest of the Postgres cluster (io workers, WAL writer, checkpointer,
autovacuum: the IO done for those backends) and of the broker, what else took the machine's CPU
meanwhile (by process), and the load average around it; their sum gives
`cpu_bound_events_per_s`, the most this machine's cores could settle were they never idle
(for the batched path, and for the per-message baseline). Last line: JSON.

    .venv/bin/python bench/metering.py [--events N] [--quick] [--replicas N]
    .venv/bin/python bench/metering.py --quick --fresh-only --profile DIR   # cProfile of the service
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import for_code
from aiokafka.protocol.admin import DeleteGroupsRequest

from whetstone.contracts import TOPICS, all_topic_partitions
from whetstone.metering.domain.usage import job_class_of
from whetstone.metering.entrypoints.handlers import TOPICS as METERED_TOPICS
from whetstone.devstack.metering_sim import Invoice, Workload, generate
from whetstone.devstack.stack import EmbeddedStack, StackEndpoints
from whetstone.devstack.testing import group_members
from whetstone.runtime.membership import ask_coordinator

from procstat import (children_of, cluster_cpu_s, machine_cpu_s, parent_of, proc_cpu_s,  # bench/ sibling
                      process_table, sched_s, thread_time, top_others)

GROUP = "whetstone-metering"
INVOICES_SQL = """
WITH current_lines AS (
    SELECT DISTINCT ON (job_id, segment_id) job_id, entry, charge_class FROM ledger
    WHERE scope = 'segment' ORDER BY job_id, segment_id, id DESC)
SELECT j.job_id, j.charge_class AS total_class, coalesce(s.gpu_seconds, 0) AS gpu_seconds,
       coalesce(s.billable, 0) AS billable, coalesce(s.cost, 0) AS cost, c.classes
FROM (SELECT job_id, charge_class FROM ledger WHERE scope = 'job') j
LEFT JOIN (SELECT job_id, sum(gpu_seconds) AS gpu_seconds, sum(billable_gpu_seconds) AS billable, sum(cost) AS cost
           FROM ledger WHERE scope = 'segment' GROUP BY job_id) s USING (job_id)
LEFT JOIN (SELECT job_id, array_agg(charge_class) AS classes FROM current_lines WHERE entry = 'charge'
           GROUP BY job_id) c USING (job_id)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def produce(bootstrap: str, messages: list[tuple[str, bytes, bytes]]) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1024 * 1024, acks="all")
    await producer.start()
    start = time.perf_counter()
    try:
        pending = []
        for topic, key, value in messages:
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 20000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - start


METERED_PARTITIONS = [TopicPartition(t, p) for t in METERED_TOPICS for p in range(TOPICS[t].partitions)]


async def committed(watcher: AIOKafkaConsumer) -> int:
    """Messages the service has handled and committed: the sum of its group's offsets (the topics
    hold only this workload). Asked of the broker, not of the service: its /metrics exposition
    costs it ~40 ms of CPU per scrape, which polling would take from the run being measured.
    `watcher` is a consumer of the group that never joins it; one OffsetFetch for all partitions
    through its coordinator (the admin client's OffsetFetch version is one the dev broker rejects)."""
    offsets = await watcher._coordinator.fetch_committed_offsets(METERED_PARTITIONS)
    return sum(max(o.offset, 0) for o in offsets.values())


async def delete_group(bootstrap: str) -> None:
    """Delete the metering group (DeleteGroups; the broker deletes only a group without members)."""
    response = await ask_coordinator(bootstrap, GROUP, DeleteGroupsRequest([GROUP]))
    for group, code in response.results:
        if code:
            raise for_code(code)(f"DeleteGroups {group}")


async def rewind(bootstrap: str, wait_s: float = 30.0) -> None:
    """Start the metering group over at offset 0 on every partition it reads, once the group has no
    members (the replicas leave it when they stop: the runtime's membership.py): delete the group, then
    commit the offsets from outside it (generation -1, assigned not subscribed, so it never joins), as a
    tool resetting a group's offsets does. Deleting it first matters on the dev broker: after members
    leave it together, it can keep a rebalance of nobody open and hold the next join for minutes. The dev
    broker expires a silent member's session only when someone joins, so a member still listed is an
    error here, not something to wait out."""
    deadline = time.perf_counter() + wait_s
    while members := await group_members(bootstrap, GROUP):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{GROUP} still has members {members} {wait_s:.0f}s after its replicas stopped")
        await asyncio.sleep(0.2)
    await delete_group(bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(METERED_PARTITIONS)
        await consumer.commit({tp: 0 for tp in METERED_PARTITIONS})
    finally:
        await consumer.stop()


class Metering:
    """The real service in its own process, as it runs in production (one replica of it)."""

    def __init__(self, endpoints: StackEndpoints, workdir: Path, batch_size: int, profile: Path | None = None,
                 name: str = "metering") -> None:
        self.port = free_port()
        self.profile = profile  # write the service's cProfile there when it stops
        self.env = {**os.environ, **endpoints.as_env(), "WHETSTONE_DATA_DIR": str(workdir),
                    "WHETSTONE_LOG_LEVEL": "INFO", "WHETSTONE_METERING_HTTP_PORT": str(self.port),
                    "WHETSTONE_METERING_BATCH_SIZE": str(batch_size), "WHETSTONE_METERING_CLOSE_GRACE_S": "2",
                    "WHETSTONE_METERING_ORPHAN_GRACE_S": "60", "WHETSTONE_METERING_SWEEP_INTERVAL_S": "0.5",
                    "WHETSTONE_METERING_METRICS_INTERVAL_S": "2"}
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        # one client, made once: a new httpx client builds an SSL context (~80 ms of CPU), which
        # every poll would take from the service being measured on this 2-core machine
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", verify=False)

    async def start(self) -> None:
        with self.log.open("ab") as log:
            profiler = ["-m", "cProfile", "-o", str(self.profile)] if self.profile else []
            self.proc = subprocess.Popen([sys.executable, *profiler, "-m", "whetstone.metering"], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT)
        while True:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").splitlines()[-15:]   # the workdir goes with the run
                raise RuntimeError(f"metering exited with {self.proc.returncode}; the end of {self.log}:\n"
                                   + "\n".join(tail))
            try:
                if (await self.http.get("/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)

    async def gauges(self, *names: str) -> str:
        text = (await self.http.get("/metrics")).text
        return ", ".join(line for line in text.splitlines()
                         if any(line.startswith(f"whetstone_metering_{n} ") for n in names))

    def cpu_s(self) -> float:
        """CPU seconds the service process used so far (user + system): on a shared machine a
        figure that does not depend on what else runs."""
        assert self.proc is not None
        return proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


def stop_all(services: list[Metering]) -> None:
    """Signal every replica first, then wait for each: no replica is left running to rejoin the group
    for the partitions another has just given up."""
    for s in services:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in services:
        s.stop()


async def settled(conn: asyncpg.Connection, work: Workload, report: bool = False) -> bool:
    jobs = await conn.fetchval("SELECT count(*) FROM ledger WHERE scope = 'job'")
    waiting = await conn.fetchval("SELECT count(*) FROM segments WHERE waiting")
    anomalies = await conn.fetchval("SELECT count(*) FROM anomalies WHERE resolved_at IS NULL")
    if report:
        oldest = await conn.fetchval("SELECT min(terminal_at) FROM jobs WHERE closed_at IS NULL")
        print(f"  waiting to settle: {jobs}/{len(work.jobs)} job totals, {waiting} segments waiting,"
              f" {anomalies}/{len(work.anomalies)} anomalies; oldest unclosed outcome emitted {oldest}", flush=True)
    return jobs == len(work.jobs) and waiting == 0 and anomalies == len(work.anomalies)


async def backend_cpu(conn: asyncpg.Connection) -> dict[int, float]:
    """CPU seconds used so far by each Postgres backend serving the service (the stack is the bench's own)."""
    pids = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
                            " AND pid <> pg_backend_pid()")
    return {r["pid"]: proc_cpu_s(r["pid"]) for r in pids}


def load() -> float:
    return round(os.getloadavg()[0], 1)


def broker_pid(stack: EmbeddedStack) -> int | None:
    """The embedded broker's process (its CPU per event is part of the platform's cost)."""
    for pid in stack.pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "tansu":
                return pid
        except OSError:
            continue
    return None


def replicas_of(endpoints: StackEndpoints, workdir: Path, batch_size: int, profile: Path | None,
                replicas: int) -> list[Metering]:
    """The service's replicas: processes of one consumer group, each with its own port, log and profile."""
    if replicas == 1:
        return [Metering(endpoints, workdir, batch_size, profile)]
    return [Metering(endpoints, workdir, batch_size, profile and profile.with_name(f"{profile.stem}-r{i}.prof"),
                     name=f"metering-{i}") for i in range(replicas)]


async def replay(n: int, endpoints: StackEndpoints, work: Workload, workdir: Path, batch_size: int,
                 fresh_database: bool, profile: Path | None = None, broker: int | None = None,
                 replicas: int = 1) -> dict:
    conn = await asyncpg.connect(endpoints.database_url)
    services = replicas_of(endpoints, workdir, batch_size, profile, replicas)
    service = services[0]  # the one asked for its gauges
    watcher = AIOKafkaConsumer(bootstrap_servers=endpoints.kafka_bootstrap, group_id=GROUP, enable_auto_commit=False)
    await watcher.start()
    try:
        t = time.perf_counter()
        if n > 1:
            await rewind(endpoints.kafka_bootstrap)
        if fresh_database:
            await conn.execute("DROP SCHEMA IF EXISTS metering CASCADE")
        rewound = time.perf_counter()
        await asyncio.gather(*(s.start() for s in services))
        # a replica is up once its consumer holds partitions: the group's join, not part of the replay's time
        print(f"  replay {n}: rewound in {rewound - t:.1f}s, replicas up (joined) in"
              f" {time.perf_counter() - rewound:.1f}s", flush=True)
        began, load_before = time.perf_counter(), load()
        cpu0, db0 = [s.cpu_s() for s in services], await backend_cpu(conn)
        broker0 = proc_cpu_s(broker) if broker else 0.0
        # the cluster's CPU less this connection's backend (the bench's own polling)
        own = await conn.fetchval("SELECT pg_backend_pid()")
        postmaster = parent_of(own)
        cluster0, own0 = cluster_cpu_s(postmaster), proc_cpu_s(own)
        pids = [s.proc.pid for s in services if s.proc is not None]
        sched0, machine0, procs0 = [sched_s(pid) for pid in pids], machine_cpu_s(), process_table()
        await conn.execute("SET search_path TO metering")
        while await committed(watcher) < len(work.messages):
            await asyncio.sleep(0.5)
        consumed_s = time.perf_counter() - began
        polls = 0
        deadline = time.perf_counter() + 180  # a ledger that never settles is a result, not a hang
        while not await settled(conn, work, report=polls % 20 == 19) and time.perf_counter() < deadline:
            polls += 1
            if polls % 20 == 19:
                print("  " + await service.gauges("event_time_seconds", "partitions_behind"), flush=True)
            await asyncio.sleep(0.5)
        settled_s = time.perf_counter() - began
        # every replica's CPU: the work of settling is shared between them
        cpu_s = sum(s.cpu_s() - c0 for s, c0 in zip(services, cpu0, strict=True))
        db_cpu_s = sum(t - db0.get(pid, 0.0) for pid, t in (await backend_cpu(conn)).items())
        db_total_s = cluster_cpu_s(postmaster) - cluster0 - (proc_cpu_s(own) - own0)
        broker_cpu_s = proc_cpu_s(broker) - broker0 if broker else 0.0
        sched1, machine1, procs1 = [sched_s(pid) for pid in pids], machine_cpu_s(), process_table()
        machine = {k: machine1[k] - machine0[k] for k in machine0}
        others_s = machine["processes"] + machine["interrupts"] - cpu_s - db_total_s - broker_cpu_s
        counted = {*pids, *(children_of(postmaster) - {own}), postmaster, *([broker] if broker else [])}
        load_after = load()
        while await conn.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL"):
            await asyncio.sleep(0.5)
        drained_s = time.perf_counter() - began
        stop_all(services)
        invoices = await read_invoices(conn)
        stats = {"replay": n, "fresh_database": fresh_database, "consumed_s": round(consumed_s, 1),
                 "settled_s": round(settled_s, 1), "outbox_drained_s": round(drained_s, 1),
                 "events_per_s": round(len(work.messages) / settled_s),
                 # load-independent: CPU microseconds per message, the service's and its Postgres backends'
                 "service_cpu_us_per_event": round(1e6 * cpu_s / len(work.messages)),
                 "db_cpu_us_per_event": round(1e6 * db_cpu_s / len(work.messages)),
                 # the rest of the Postgres cluster's CPU meanwhile, which writes and reads for those backends:
                 # io workers (Postgres 18 reads and writes data files in them), WAL writer, checkpointer,
                 # background writer, autovacuum (the bench's own connection excepted)
                 "db_aux_cpu_us_per_event": round(1e6 * max(db_total_s - db_cpu_s, 0.0) / len(work.messages)),
                 "broker_cpu_us_per_event": round(1e6 * broker_cpu_s / len(work.messages)),
                 "load_1m": [load_before, load_after], "replicas": len(services),
                 # where each replica's main thread spent the replay's wall time: running, runnable but
                 # waiting for a core held by something else, and idle (waiting on Postgres, the broker
                 # or a timer); fractions of settled_s
                 "service_thread": [thread_time(s0, s1, settled_s) for s0, s1 in zip(sched0, sched1, strict=True)],
                 # CPU-seconds per second the machine spent meanwhile on anything but the service, its
                 # Postgres cluster and the broker (out of os.cpu_count()): other processes, the kernel's
                 # interrupt handling; the most costly of them, and what the hypervisor stole
                 "others_cpu_s_per_s": round(max(others_s, 0.0) / settled_s, 2),
                 "others_top": top_others(procs0, procs1, counted, settled_s)
                 + [["[irq+softirq]", round(machine["interrupts"] / settled_s, 3)]],
                 "steal_cpu_s_per_s": round(machine["steal"] / settled_s, 3),
                 "ledger_rows": await conn.fetchval("SELECT count(*) FROM ledger"),
                 "corrections": await conn.fetchval("SELECT count(*) FROM ledger WHERE entry = 'reversal'"),
                 "usage_events": await conn.fetchval("SELECT count(*) FROM outbox WHERE topic = 'usage.metered'"),
                 "mismatched_jobs": mismatches(invoices, work)}
        return {"stats": stats, "invoices": invoices}
    finally:
        stop_all(services)
        for s in services:
            await s.http.aclose()
        await watcher.stop()
        await conn.close()


async def read_invoices(conn: asyncpg.Connection) -> dict[str, Invoice]:
    rows = await conn.fetch(INVOICES_SQL)
    return {r["job_id"]: Invoice(r["gpu_seconds"], r["billable"], r["cost"],
                                 job_class_of(set(r["classes"] or ()), r["total_class"])) for r in rows}


def mismatches(invoices: dict[str, Invoice], work: Workload) -> int:
    bad = [j for j, inv in work.invoices.items() if invoices.get(j) != inv]
    for job_id in bad[:5]:
        print(f"  mismatch {job_id}: ledger {invoices.get(job_id)} != truth {work.invoices[job_id]}", flush=True)
    return len(bad) + len(set(invoices) - set(work.invoices))


# what one event costs, in CPU microseconds: the service, the Postgres cluster (its backends serving the
# service, and the rest of it) and the broker
COST_KEYS = ("service_cpu_us_per_event", "db_cpu_us_per_event", "db_aux_cpu_us_per_event", "broker_cpu_us_per_event")


def cpu_ceiling(cpu_us_per_event: float) -> float:
    """Events per second this machine's cores could settle, never idle, at this CPU cost per event."""
    return 1e6 * (os.cpu_count() or 1) / max(cpu_us_per_event, 1)


async def run(args: argparse.Namespace) -> dict:
    t = time.perf_counter()
    work = generate(args.events, seed=args.seed)
    gc.freeze()  # a million generated objects need no more scanning
    print(f"generated {len(work.messages):,} messages ({work.unique_events:,} unique events, "
          f"{len(work.messages) - work.unique_events:,} duplicates) for {len(work.jobs):,} jobs, "
          f"{len(work.anomalies)} with bad input, in {time.perf_counter() - t:.1f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="wt-bench-metering-") as tmp:
        stack = EmbeddedStack(Path(tmp) / "stack", topics=all_topic_partitions(), buckets=["whetstone"],
                              log=lambda m: None)
        endpoints = stack.start()
        try:
            seconds = await produce(endpoints.kafka_bootstrap, work.messages)
            print(f"produced them in {seconds:.1f}s ({len(work.messages) / seconds:,.0f}/s)", flush=True)
            results = []
            for n, fresh in ((1, True), (2, False), (3, True))[:1 if args.fresh_only else 3]:
                profile = args.profile / f"replay{n}.prof" if args.profile else None
                r = await replay(n, endpoints, work, Path(tmp), args.batch_size, fresh, profile, broker_pid(stack),
                                 args.replicas)
                print("replay " + json.dumps(r["stats"]), flush=True)
                results.append(r)
        finally:
            stack.stop()
    if args.fresh_only:
        one = results[0]["stats"]
        ceiling = cpu_ceiling(sum(one[k] for k in COST_KEYS))
        return {"events": len(work.messages), **one, "cpu_bound_events_per_s": round(ceiling),
                "ceiling_ratio": round(one["events_per_s"] / ceiling, 3),
                **({"profile": str(args.profile / "replay1.prof")} if args.profile else {})}
    base = await baseline(args)
    first = results[0]["invoices"]
    fresh = [results[0]["stats"], results[2]["stats"]]
    cpu = {k: max(r[k] for r in fresh) for k in COST_KEYS}
    ceiling = cpu_ceiling(sum(cpu.values()))
    return {"events": len(work.messages), "unique_events": work.unique_events, "jobs": len(work.jobs),
            "events_per_s": min(r["stats"]["events_per_s"] for r in results),
            "events_per_s_by_replay": [r["stats"]["events_per_s"] for r in results],
            # CPU per message of the fresh replays (the worse of 1 and 3): what the figure above costs,
            # whatever else runs on the machine (load_1m: the 1-minute load average around each replay)
            **cpu,
            # the most this machine could settle if nothing else ran and its cores never waited: its cores'
            # CPU-seconds per second over the CPU microseconds one event costs (service + Postgres + broker)
            "cpu_bound_events_per_s": round(ceiling),
            # each fresh replay's rate over the ceiling its own cost per event gives (the cost differs
            # between replays: how much of the tables Postgres finds in its buffers): the share of the
            # machine's cores that the service, its Postgres cluster and the broker kept busy settling
            "ceiling_ratio_by_fresh_replay": [round(r["events_per_s"] / cpu_ceiling(sum(r[k] for k in COST_KEYS)), 3)
                                              for r in fresh],
            # the same with the cluster's own processes left out of the cost (counted as other load instead)
            "ceiling_ratio_without_db_aux_by_fresh_replay": [round(r["events_per_s"] / cpu_ceiling(
                sum(r[k] for k in COST_KEYS) - r["db_aux_cpu_us_per_event"]), 3) for r in fresh],
            # two tighter bounds, for reading the ratio to the one above: each replica is one thread, so
            # they settle at most replicas * 1e6 / the service CPU per event (were the events split evenly),
            # however idle the cores; and the cores the rest of the machine left free during the slowest
            # fresh replay, at the same cost per event
            "replicas": args.replicas,
            "service_thread_bound_events_per_s": round(args.replicas * 1e6 / max(cpu["service_cpu_us_per_event"], 1)),
            "cpu_bound_given_others_events_per_s": round(1e6 * max(
                (os.cpu_count() or 1) - max(r["others_cpu_s_per_s"] for r in fresh), 0.0) / max(sum(cpu.values()), 1)),
            "load_1m_by_replay": [r["stats"]["load_1m"] for r in results],
            "service_thread_by_replay": [r["stats"]["service_thread"] for r in results],
            "others_cpu_s_per_s_by_replay": [r["stats"]["others_cpu_s_per_s"] for r in results],
            "others_top_by_replay": [r["stats"]["others_top"] for r in results],
            "steal_cpu_s_per_s_by_replay": [r["stats"]["steal_cpu_s_per_s"] for r in results],
            "invoices_identical_across_replays": all(r["invoices"] == first for r in results),
            "ledger_rows_after_replay_2_equal_replay_1":
                results[1]["stats"]["ledger_rows"] == results[0]["stats"]["ledger_rows"],
            "mismatched_jobs": max(r["stats"]["mismatched_jobs"] for r in results), **base}


async def baseline(args: argparse.Namespace) -> dict:
    """The same service consuming one message per transaction (the runtime's default path:
    inbox claim, handler, outbox in one transaction per message), then batched, on a sample
    workload small enough for the slow path, in a stack of its own."""
    n = min(20_000, max(args.events // 10, 5_000))
    work = generate(n, seed=args.seed + 1)
    with tempfile.TemporaryDirectory(prefix="wt-bench-metering-base-") as tmp:
        stack = EmbeddedStack(Path(tmp) / "stack", topics=all_topic_partitions(), buckets=["whetstone"],
                              log=lambda m: None)
        endpoints = stack.start()
        try:
            await produce(endpoints.kafka_bootstrap, work.messages)
            one = (await replay(1, endpoints, work, Path(tmp), 0, True, broker=broker_pid(stack)))["stats"]
            print("baseline (one message per transaction) " + json.dumps(one), flush=True)
            batched = (await replay(2, endpoints, work, Path(tmp), args.batch_size, True))["stats"]
            print("same sample, batched " + json.dumps(batched), flush=True)
        finally:
            stack.stop()
    durable = await durable_broker(args, work)
    return {"baseline_sample_events": len(work.messages), "baseline_per_message_events_per_s": one["events_per_s"],
            "baseline_per_message_service_cpu_us_per_event": one["service_cpu_us_per_event"],
            "baseline_per_message_db_cpu_us_per_event": one["db_cpu_us_per_event"],
            "baseline_per_message_db_aux_cpu_us_per_event": one["db_aux_cpu_us_per_event"],
            "baseline_per_message_broker_cpu_us_per_event": one["broker_cpu_us_per_event"],
            "baseline_per_message_cpu_bound_events_per_s": round(cpu_ceiling(sum(one[k] for k in COST_KEYS))),
            "baseline_per_message_load_1m": one["load_1m"],
            "sample_batched_events_per_s": batched["events_per_s"], **durable,
            "durable_broker_cost": round(1 - durable["durable_broker_sample_events_per_s"]
                                         / max(batched["events_per_s"], 1), 3),
            "speedup_vs_per_message": round(batched["events_per_s"] / max(one["events_per_s"], 1), 1),
            "baseline_mismatched_jobs": one["mismatched_jobs"]}


async def durable_broker(args: argparse.Namespace, work: Workload) -> dict:
    """The same sample, batched, on the durable dev broker (`whet stack up`'s default: the broker's
    log in the embedded S3) instead of the in-memory one: what surviving a broker restart costs."""
    with tempfile.TemporaryDirectory(prefix="wt-bench-metering-durable-") as tmp:
        stack = EmbeddedStack(Path(tmp) / "stack", topics=all_topic_partitions(), buckets=["whetstone"],
                              log=lambda m: None, broker_storage="s3")
        endpoints = stack.start()
        try:
            produced = await produce(endpoints.kafka_bootstrap, work.messages)
            stats = (await replay(1, endpoints, work, Path(tmp), args.batch_size, True))["stats"]
            print(f"same sample, durable broker: produced in {produced:.1f}s; " + json.dumps(stats), flush=True)
        finally:
            stack.stop()
    return {"durable_broker_sample_events_per_s": stats["events_per_s"],
            "durable_broker_produce_per_s": round(len(work.messages) / produced),
            "durable_broker_mismatched_jobs": stats["mismatched_jobs"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="lifecycle messages to generate (dups included)")
    p.add_argument("--quick", action="store_true", help="100,000 events")
    p.add_argument("--batch-size", type=int, default=2000)
    p.add_argument("--replicas", type=int, default=2, help="metering processes in the consumer group (default:"
                   " production's, deploy/base; the baselines run one)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--profile", type=Path, help="write the service's cProfile of each replay in this folder")
    p.add_argument("--fresh-only", action="store_true", help="replay 1 only (fresh database), no baselines:"
                   " for profiling and A/B runs, not a result")
    args = p.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.events = 100_000
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
