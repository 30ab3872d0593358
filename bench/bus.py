"""Bus benchmark: the service CPU that exactly-once consumption costs per message.

20,000 `job.progress` envelopes (200 jobs x 100 steps) are produced once to the embedded broker.
Then, each in its own process with its own consumer group, so each reads all of them from offset 0:

1. per_message: a service on the runtime's per-message path (`Service.subscriptions` only): each
   message is decoded, checked against the inbox, handled in its own Postgres transaction (inbox
   claim, tenant check, an upsert of the job's latest progress), offsets committed after it;
2. batched: the same service with a `batch_handler` (one transaction per fetched batch, the same
   upserts as one statement; batching.py);
3. floor: a bare aiokafka consumer that only decodes each envelope and its payload, committing its
   offsets once per fetch: what consuming costs before any bookkeeping.

Figure: CPU microseconds of the consuming process per message (user + system, /proc), from the
first message it handles until the group's committed offsets cover all of them (asked of the broker,
not of the service); the Postgres backends' CPU beside it. Each mode's result is checked: one row
per job, its last step, and every report counted exactly once.

    .venv/bin/python bench/bus.py [--messages N] [--jobs J] [--modes per_message,batched,floor] [--profile DIR]

Last line: JSON with per_message_cpu_us, batched_cpu_us, floor_cpu_us.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from procstat import proc_cpu_s  # bench/ sibling module

MODES = ("per_message", "batched", "floor")
TENANT = "demo"
TOPIC = "job.progress"

MIGRATION = """
CREATE TABLE progress (
    job_id  text PRIMARY KEY,
    step    int NOT NULL,
    loss    double precision,
    reports int NOT NULL
);
"""
UPSERT = """
INSERT INTO progress (job_id, step, loss, reports)
SELECT * FROM unnest($1::text[], $2::int[], $3::float8[], $4::int[])
ON CONFLICT (job_id) DO UPDATE SET
    loss = CASE WHEN excluded.step >= progress.step THEN excluded.loss ELSE progress.loss END,
    step = greatest(progress.step, excluded.step),
    reports = progress.reports + excluded.reports
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the consuming processes


class FirstMark:
    """Writes the process's CPU seconds when the first message is handled (the window's start)."""

    def __init__(self, path: Path) -> None:
        self.path, self.done = path, False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.path.write_text(repr(time.process_time()))


def progress_service(mode: str, mark: FirstMark):
    from whetstone.contracts import JobProgressV1
    from whetstone.runtime.service import Service

    async def on_progress(rt, uow, env, event: JobProgressV1) -> None:
        mark()
        await uow.conn.execute(UPSERT, [event.job_id], [event.step], [event.loss], [1])

    async def on_batch(rt, uow, deliveries) -> None:
        mark()
        latest: dict[str, list] = {}
        for d in deliveries:  # one row per job: its highest step (its loss) and how many reports
            ev = d.event
            row = latest.get(ev.job_id)
            if row is None:
                latest[ev.job_id] = [ev.step, ev.loss, 1]
            else:
                if ev.step >= row[0]:
                    row[0], row[1] = ev.step, ev.loss
                row[2] += 1
        jobs = list(latest)
        await uow.conn.execute(UPSERT, jobs, [latest[j][0] for j in jobs], [latest[j][1] for j in jobs],
                               [latest[j][2] for j in jobs])

    return Service(name=f"bus-{mode.replace('_', '-')}", migrations=[MIGRATION], subscriptions={TOPIC: on_progress},
                   batch_handler=on_batch if mode == "batched" else None)


async def floor_consumer(mark: FirstMark) -> None:
    from aiokafka import AIOKafkaConsumer

    from whetstone.contracts import JobProgressV1
    from whetstone.runtime.messaging import decode, parse_payload

    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=os.environ["WHETSTONE_KAFKA_BOOTSTRAP"],
                                group_id="bus-floor", enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=500)
            for records in batches.values():
                mark()
                for rec in records:
                    parse_payload(decode(rec.value), JobProgressV1)
            if batches:
                await consumer.commit()
    finally:
        await consumer.stop()


def serve(mode: str, mark_path: Path, profile: Path | None) -> None:
    mark = FirstMark(mark_path)
    if mode == "floor":
        main = floor_consumer(mark)
    else:
        from whetstone.runtime.service import run_services

        main = run_services([progress_service(mode, mark)])
    if profile is None:
        asyncio.run(main)
        return
    import cProfile

    with cProfile.Profile(time.process_time) as prof:  # CPU time: on a shared machine, wall time is noise
        asyncio.run(main)
    prof.dump_stats(profile / f"{mode}.prof")


# ------------------------------------------------------------------ the bench


def envelopes(n: int, jobs: int) -> list[tuple[bytes, bytes]]:
    from whetstone.contracts import JobProgressV1
    from whetstone.runtime.messaging import encode, make_envelope

    out = []
    per_job = max(1, n // jobs)
    for i in range(n):
        job, step = f"job-bus-{i % jobs:04d}", i // jobs + 1
        event = JobProgressV1(job_id=job, segment_id=f"{job}-s1", attempt=1, step=step, total_steps=per_job,
                              loss=round(3.0 / step, 6), learning_rate=2e-4, tokens_per_s=1234.5, step_time_s=0.5)
        env = make_envelope(event, producer="bench-bus", tenant_id=TENANT)
        out.append((env.key.encode(), encode(env)))
    return out


async def produce(bootstrap: str, messages: list[tuple[bytes, bytes]]) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1024 * 1024, acks="all")
    await producer.start()
    start = time.perf_counter()
    try:
        pending = [await producer.send(TOPIC, value, key=key) for key, value in messages]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - start


async def committed(watcher, partitions) -> int:
    """Messages the group committed (the topic holds only this workload), asked of the broker."""
    offsets = await watcher._coordinator.fetch_committed_offsets(partitions)
    return sum(max(o.offset, 0) for o in offsets.values())


async def backend_cpu(conn, application: str) -> dict[int, float]:
    """CPU seconds so far of each Postgres backend serving the consuming service."""
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = $1", application)
    return {r["pid"]: proc_cpu_s(r["pid"]) for r in rows}


async def measure(mode: str, endpoints, workdir: Path, expected: dict, n: int, timeout_s: float,
                  profile_dir: Path | None = None) -> dict:
    import asyncpg
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from whetstone.contracts import TOPICS

    group = "bus-floor" if mode == "floor" else f"whetstone-bus-{mode.replace('_', '-')}"
    schema = f"bus_{mode}"
    mark = workdir / f"{mode}.first"
    env = {**os.environ, **endpoints.as_env(), "WHETSTONE_DATA_DIR": str(workdir / mode),
           "WHETSTONE_LOG_LEVEL": "WARNING"}
    partitions = [TopicPartition(TOPIC, p) for p in range(TOPICS[TOPIC].partitions)]
    watcher = AIOKafkaConsumer(bootstrap_servers=endpoints.kafka_bootstrap, group_id=group, enable_auto_commit=False)
    await watcher.start()
    conn = await asyncpg.connect(endpoints.database_url)
    with (workdir / f"{mode}.log").open("wb") as out:
        profile = ["--profile", str(profile_dir)] if profile_dir else []
        proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, "--mark", str(mark), *profile], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        began = time.perf_counter()
        db0: dict[int, float] | None = None  # the service's Postgres backends' CPU at its first message
        while (done := await committed(watcher, partitions)) < n:
            if proc.poll() is not None:
                raise RuntimeError(f"{mode} exited with {proc.returncode}; see {workdir / f'{mode}.log'}")
            if time.perf_counter() - began > timeout_s:
                raise RuntimeError(f"{mode}: {done}/{n} committed after {timeout_s:.0f}s")
            if db0 is None and mark.exists():
                db0 = await backend_cpu(conn, f"whetstone-{schema}")
            await asyncio.sleep(0.1)
        cpu = proc_cpu_s(proc.pid) - float(mark.read_text())
        result = {"cpu_us": round(1e6 * cpu / n, 1), "wall_s": round(time.perf_counter() - began, 1)}
        if mode != "floor":
            db1 = await backend_cpu(conn, f"whetstone-{schema}")
            result["db_cpu_us"] = round(1e6 * sum(t - (db0 or {}).get(pid, 0.0) for pid, t in db1.items()) / n, 1)
            result["state_ok"] = await state_ok(conn, schema, expected, n)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        await watcher.stop()
        await conn.close()
    return result


async def state_ok(conn, schema: str, expected: dict, n: int) -> bool:
    """One row per job with its last step and loss, and every report counted once."""
    rows = await conn.fetch(f"SELECT job_id, step, loss, reports FROM {schema}.progress")
    got = {r["job_id"]: (r["step"], r["loss"]) for r in rows}
    inbox = await conn.fetchval(f"SELECT count(*) FROM {schema}.inbox")
    return got == expected and sum(r["reports"] for r in rows) == n and inbox == n


async def run(args: argparse.Namespace) -> dict:
    from whetstone.contracts import all_topic_partitions
    from whetstone.devstack.stack import EmbeddedStack

    messages = envelopes(args.messages, args.jobs)
    expected: dict[str, tuple[int, float]] = {}
    for i in range(args.messages):
        job, step = f"job-bus-{i % args.jobs:04d}", i // args.jobs + 1
        expected[job] = (step, round(3.0 / step, 6))
    report: dict = {"bench": "bus", "messages": args.messages, "jobs": args.jobs, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="wt-bench-bus-") as tmp:
        stack = EmbeddedStack(Path(tmp) / "stack", topics=all_topic_partitions(), buckets=["whetstone"],
                              log=lambda m: None)
        endpoints = stack.start()
        try:
            seconds = await produce(endpoints.kafka_bootstrap, messages)
            log(f"produced {len(messages):,} {TOPIC} messages in {seconds:.1f}s")
            for mode in args.modes.split(","):
                load = os.getloadavg()[0]
                result = await measure(mode, endpoints, Path(tmp), expected, args.messages, args.timeout, args.profile)
                result["load_1m"] = [round(load, 1), round(os.getloadavg()[0], 1)]
                log(f"{mode}: {json.dumps(result)}")
                report[mode] = result
                report[f"{mode}_cpu_us"] = result["cpu_us"]
        finally:
            stack.stop()
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a mode may take to commit everything")
    p.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)  # the consuming process itself
    p.add_argument("--mark", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--profile", type=Path, help="write each consuming process's cProfile (<mode>.prof) here")
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.mark, args.profile)
        return
    if args.profile:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        p.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
