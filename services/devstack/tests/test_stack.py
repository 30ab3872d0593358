"""The embedded stack against its real servers: Tansu (Kafka protocol), PostgreSQL, SeaweedFS (S3)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import asyncpg
import boto3
import botocore.exceptions
import psutil
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from whetstone.devstack.stack import EmbeddedStack, StackEndpoints
from whetstone.devstack.testing import topic_partitions

pytestmark = pytest.mark.integration

GONE_WITHIN_S = 10.0


def _s3(endpoints: StackEndpoints):  # noqa: ANN202 - boto3 clients are untyped
    return boto3.client(
        "s3",
        endpoint_url=endpoints.s3_endpoint,
        aws_access_key_id=endpoints.s3_access_key,
        aws_secret_access_key=endpoints.s3_secret_key,
        region_name="us-east-1",
    )


def _server_processes(pids: Iterable[int]) -> list[psutil.Process]:
    """The given processes and all their descendants (e.g. PostgreSQL backends)."""
    processes: list[psutil.Process] = []
    for pid in pids:
        process = psutil.Process(pid)
        processes += [process, *process.children(recursive=True)]
    return processes


def _still_running(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    running = []
    for process in processes:
        try:
            # A zombie is dead; it only waits for whoever inherited it to reap it.
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            pass
    return running


def _wait_until_gone(processes: list[psutil.Process], timeout_s: float = GONE_WITHIN_S) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while (running := _still_running(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return running


async def _kafka_roundtrip(bootstrap: str, topic: str) -> bytes:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"hello whetstone", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id="test-stack", auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), timeout=30)
        await consumer.commit()
        return message.value
    finally:
        await consumer.stop()


async def _postgres_roundtrip(database_url: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval("SELECT 1") == 1
        await connection.execute("CREATE TABLE jobs (id serial PRIMARY KEY, name text NOT NULL)")
        await connection.execute("INSERT INTO jobs (name) VALUES ($1)", "first")
        return await connection.fetchval("SELECT count(*) FROM jobs")
    finally:
        await connection.close()


def test_stack_serves_kafka_postgres_and_s3_and_stops_its_processes(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path / "stack", topics=[("jobs.requested", 3)], buckets=["artifacts"])
    began = time.monotonic()
    endpoints = stack.start()
    print(f"start() took {time.monotonic() - began:.1f}s")
    try:
        servers = _server_processes(stack.pids)
        names = {process.name() for process in servers}
        assert {"tansu", "weed", "postgres"} <= names

        assert asyncio.run(_kafka_roundtrip(endpoints.kafka_bootstrap, "jobs.requested")) == b"hello whetstone"
        assert asyncio.run(topic_partitions(endpoints.kafka_bootstrap, "jobs.requested")) == 3
        assert asyncio.run(_postgres_roundtrip(endpoints.database_url)) == 1
        s3 = _s3(endpoints)
        s3.put_object(Bucket="artifacts", Key="runs/1/adapter.bin", Body=b"\x00weights")
        assert s3.get_object(Bucket="artifacts", Key="runs/1/adapter.bin")["Body"].read() == b"\x00weights"
        assert list((tmp_path / "stack" / "logs").glob("*.log"))
    finally:
        stack.stop()

    assert _wait_until_gone(servers, timeout_s=1.0) == []
    assert stack.pids == []
    stack.stop()  # idempotent


def _launch_stack_up(data_dir: Path, env_file: Path, log_file: Path) -> subprocess.Popen[bytes]:
    code = (
        "import sys; from pathlib import Path; from whetstone.devstack.stack_up import stack_up_main; "
        "sys.exit(stack_up_main(Path(sys.argv[1]), [('jobs.requested', 1)], ['artifacts'], Path(sys.argv[2])))"
    )
    with open(log_file, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir), str(env_file)], stdout=log, stderr=subprocess.STDOUT
        )


def _wait_for_env_file(launcher: subprocess.Popen[bytes], env_file: Path, log_file: Path) -> None:
    deadline = time.monotonic() + 90
    while not env_file.exists():
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            pytest.fail(f"`stack up` did not publish {env_file}; its output:\n{log_file.read_text()}")
        time.sleep(0.1)


def _launched_servers(launcher: subprocess.Popen[bytes]) -> list[psutil.Process]:
    servers = psutil.Process(launcher.pid).children(recursive=True)
    assert {"tansu", "weed", "postgres"} <= {process.name() for process in servers}
    return servers


def test_sigkill_of_the_launcher_leaves_no_server_behind(tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    log_file = tmp_path / "launcher.log"
    launcher = _launch_stack_up(tmp_path / "stack", env_file, log_file)
    _wait_for_env_file(launcher, env_file, log_file)
    servers = _launched_servers(launcher)

    launcher.send_signal(signal.SIGKILL)
    launcher.wait()

    assert _wait_until_gone(servers) == []


def test_sigint_stops_the_stack_cleanly(tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    log_file = tmp_path / "launcher.log"
    launcher = _launch_stack_up(tmp_path / "stack", env_file, log_file)
    _wait_for_env_file(launcher, env_file, log_file)
    servers = _launched_servers(launcher)

    sourced = subprocess.run(
        ["bash", "-c", f'set -a; . "{env_file}"; echo "$WHETSTONE_DATABASE_URL"'],
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
    ).stdout.strip()
    assert sourced.startswith("postgresql://postgres:@/postgres?host=")
    assert asyncio.run(_postgres_roundtrip(sourced)) == 1

    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=30) == 0, log_file.read_text()
    assert not env_file.exists()
    assert _wait_until_gone(servers) == []


def test_external_servers_replace_embedded_ones(tmp_path: Path) -> None:
    with EmbeddedStack(tmp_path / "a", log=lambda _: None) as stack_a:
        a = stack_a.endpoints
        assert a is not None
        children_before = {p.pid for p in psutil.Process().children()}

        stack_b = EmbeddedStack(
            tmp_path / "b",
            kafka_bootstrap=a.kafka_bootstrap,
            database_url=a.database_url,
            s3_endpoint=a.s3_endpoint,
            s3_access_key=a.s3_access_key,
            s3_secret_key=a.s3_secret_key,
            topics=[("tenant.events", 2)],
            buckets=["tenant-data"],
        )
        with stack_b as b:
            assert b.endpoints == a
            assert b.pids == []
            assert {p.pid for p in psutil.Process().children()} == children_before

        assert asyncio.run(topic_partitions(a.kafka_bootstrap, "tenant.events")) == 2
        _s3(a).head_bucket(Bucket="tenant-data")
        # Creating them again is fine.
        stack_b.start()
        stack_b.stop()


@pytest.mark.integration
def test_a_durable_broker_keeps_every_acknowledged_record_across_a_crash(tmp_path):
    """`whet stack up`'s default: the broker's log lives in the embedded S3, so SIGKILLing the
    broker loses nothing that was acknowledged, and consumers resume from their committed offsets."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    stack = EmbeddedStack(tmp_path / "stack", topics=[("orders", 1)], broker_storage="s3", log=lambda m: None)
    endpoints = stack.start()
    b = endpoints.kafka_bootstrap

    async def produce(n0: int, n1: int) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=b, acks="all")
        await producer.start()
        try:
            for i in range(n0, n1):
                await producer.send_and_wait("orders", f"order-{i}".encode(), key=b"k")
        finally:
            await producer.stop()

    async def consume(expect: int, commit: bool, group: str = "g") -> list[str]:
        consumer = AIOKafkaConsumer("orders", bootstrap_servers=b, group_id=group, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        got: list[str] = []
        try:
            while len(got) < expect:
                batch = await consumer.getmany(timeout_ms=5000)
                if not batch:
                    break
                got += [r.value.decode() for rs in batch.values() for r in rs]
            if commit:
                await consumer.commit()
        finally:
            await consumer.stop()
        return got

    try:
        asyncio.run(produce(0, 50))
        before = asyncio.run(consume(30, commit=True))
        assert before[:30] == [f"order-{i}" for i in range(30)]
        stack.restart_broker(kill=True)
        asyncio.run(produce(50, 60))
        # the group resumes where it committed, with no gap
        rest = asyncio.run(consume(1000, commit=False))
        assert rest == [f"order-{i}" for i in range(len(before), 60)]
        # and every record from before the crash is still in the log
        assert asyncio.run(consume(60, commit=False, group="fresh")) == [f"order-{i}" for i in range(60)]
    finally:
        stack.stop()


def test_postgres_and_s3_stop_and_come_back_with_their_data(tmp_path):
    """Fault injection for the chaos suite: one server stopped (a crash for PostgreSQL) and started again on the
    same port with the same data; the others keep running meanwhile."""
    from botocore.config import Config
    from botocore.exceptions import EndpointConnectionError

    stack = EmbeddedStack(tmp_path / "stack", buckets=["kept-data"], log=lambda m: None)
    endpoints = stack.start()

    async def pg(sql: str):
        conn = await asyncpg.connect(endpoints.database_url)
        try:
            return await conn.fetchval(sql)
        finally:
            await conn.close()

    try:
        # the embedded PostgreSQL runs with synchronous_commit=off (speed): a commit reaches the WAL up
        # to 200 ms later, so a crash right after it may lose it. What must survive a crash is what was
        # committed synchronously, as production commits are
        async def durable_write() -> None:
            conn = await asyncpg.connect(endpoints.database_url)
            try:
                await conn.execute("SET synchronous_commit = on; CREATE TABLE kept AS SELECT 42 AS answer")
            finally:
                await conn.close()
        asyncio.run(durable_write())
        _s3(endpoints).put_object(Bucket="kept-data", Key="k", Body=b"kept")
        stack.stop_component("postgres", kill=True)
        with pytest.raises((OSError, asyncpg.PostgresError)):
            asyncio.run(pg("SELECT 1"))
        stack.start_component("postgres")
        assert asyncio.run(pg("SELECT answer FROM kept")) == 42
        stack.stop_component("s3")
        with pytest.raises(EndpointConnectionError):
            boto3.client("s3", endpoint_url=endpoints.s3_endpoint, region_name="us-east-1",
                         aws_access_key_id="x", aws_secret_access_key="y",
                         config=Config(retries={"max_attempts": 1}, connect_timeout=1)).list_buckets()
        stack.start_component("s3")
        # SeaweedFS answers S3 before its volume server has registered again: reads come back within seconds
        deadline = time.monotonic() + 30
        while True:
            try:
                assert _s3(endpoints).get_object(Bucket="kept-data", Key="k")["Body"].read() == b"kept"
                break
            except botocore.exceptions.ClientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        with pytest.raises(RuntimeError, match="no embedded kafka"):
            EmbeddedStack(tmp_path / "other", log=lambda m: None).stop_component("kafka")
    finally:
        stack.stop()


def test_a_port_taken_between_choosing_and_binding_starts_again_on_fresh_ports(tmp_path, monkeypatch):
    """Ports are chosen free and bound later by the servers: another process can take one in between
    (seen in CI as SeaweedFS's volume server exiting with `bind: address already in use`)."""
    import socket

    from whetstone.devstack import stack as stack_module

    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_free_ports = stack_module._free_ports
    handed_out: list[list[int]] = []

    def racy_free_ports(count: int) -> list[int]:
        ports = real_free_ports(count)
        if count == 8 and not handed_out:  # SeaweedFS's first start: its volume port is already taken
            ports[2] = taken
        handed_out.append(ports)
        return ports

    monkeypatch.setattr(stack_module, "_free_ports", racy_free_ports)
    messages: list[str] = []
    try:
        with EmbeddedStack(tmp_path, log=messages.append) as stack:
            assert stack.endpoints is not None
            _s3(stack.endpoints).list_buckets()
    finally:
        squatter.close()
    assert sum(1 for ports in handed_out if len(ports) == 8) == 2
    assert any("starting again on fresh ports" in m for m in messages)
