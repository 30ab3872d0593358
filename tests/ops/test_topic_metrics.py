"""Topic metrics against the real embedded broker and Postgres, and the bad input of issue 18:
a broker that refuses the admin API, a scrape during a rebalance, a metric name collision."""

import asyncio
import socket
import threading

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from prometheus_client import Gauge
from prometheus_client.registry import Collector as PromCollector

from whetstone.contracts import DatasetSubmittedV1
from whetstone.devstack.testing import send, send_event, wait_until
from whetstone.runtime.observability import Collector, Observer
from whetstone.runtime.service import PoisonMessage, Service

pytestmark = pytest.mark.integration
TOPIC = "dataset.submitted"


def probe_service() -> Service:
    async def on_submitted(rt, uow, env, event) -> None:
        if event.name == "poison":
            raise PoisonMessage("bad dataset name")
        await uow.conn.execute("SELECT 1")

    return Service(name="opsprobe", subscriptions={TOPIC: on_submitted})


def submitted(i: int, name: str = "ok") -> DatasetSubmittedV1:
    return DatasetSubmittedV1(dataset_id=f"ds-{i:024d}", name=name, source_uri=f"s3://whetstone/raw/{i}")


def sample(registry, name: str, **labels) -> float | None:
    return registry.get_sample_value(name, labels)


async def handled(rt, n: int) -> None:
    async def done():
        total = sum(sample(rt.metrics.registry, "whetstone_messages_consumed_total", service=rt.name, topic=TOPIC,
                           outcome=o) or 0 for o in ("handled", "duplicate", "dead_lettered"))
        return total >= n
    await wait_until(done, 60, f"{n} messages handled")


def collector_of(rt, bootstrap: str, **kw) -> Collector:
    return Collector(rt.metrics.registry, rt.name, group=rt.consumer, bootstrap=bootstrap, topics=[TOPIC],
                     pool=rt.pool, interval_s=1, **kw)


async def test_lag_dlq_outbox_and_duplicates_from_the_broker(platform, settings, monkeypatch):
    monkeypatch.setenv("WHETSTONE_METRICS_ENABLED", "false")  # the test drives collection itself
    bootstrap = settings.kafka_bootstrap
    async with platform(probe_service) as p:
        rt = p["opsprobe"]
        for i in range(4):
            await send_event(bootstrap, submitted(i), "demo", times=2 if i == 0 else 1)  # one duplicate
        await send_event(bootstrap, submitted(9, "poison"), "demo")
        await handled(rt, 6)
        collector = collector_of(rt, bootstrap)
        try:
            async def committed_all():
                await collector.collect_once()
                lags = [s.value for m in collector.lag.collect() for s in m.samples]
                return lags and sum(lags) == 0
            await wait_until(committed_all, 30, "lag 0 once the consumer committed")
            reg = rt.metrics.registry
            assert sample(reg, "whetstone_dlq_depth", topic=f"{TOPIC}.dlq") == 1
            assert sample(reg, "whetstone_topic_high_watermark", topic=TOPIC) == 6
            assert sample(reg, "whetstone_outbox_backlog", service="opsprobe") == 0
            assert sample(reg, "whetstone_messages_consumed_total", service="opsprobe", topic=TOPIC,
                          outcome="duplicate") == 1
            await wait_until(lambda: asyncio.sleep(0, sample(reg, "whetstone_messages_produced_total",
                                                                service="opsprobe", topic=f"{TOPIC}.dlq")),
                             10, "the dead letter published by the relay")
            assert sample(reg, "whetstone_outbox_publish_seconds_count", service="opsprobe") >= 1
            assert not sample(reg, "whetstone_observability_errors_total", service="opsprobe", source="kafka")
        finally:
            await collector.close()

    # the service is gone: what it has not consumed shows as lag per partition
    for i in range(10, 13):
        await send_event(bootstrap, submitted(i), "demo")
    from whetstone.runtime.http import ServiceMetrics

    metrics = ServiceMetrics("opsprobe")
    offline = Collector(metrics.registry, "opsprobe", group="whetstone-opsprobe", bootstrap=bootstrap,
                        topics=[TOPIC], interval_s=1)
    try:
        await offline.collect_once()
    finally:
        await offline.close()
    lag = sum(s.value for m in offline.lag.collect() for s in m.samples)
    assert lag == 3
    assert sample(metrics.registry, "whetstone_topic_high_watermark", topic=TOPIC) == 9


def refusing_broker() -> tuple[str, threading.Event]:
    """A TCP endpoint that accepts connections and closes them: a broker refusing every request."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.recv(4096)
            conn.close()
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{server.getsockname()[1]}", stop


async def test_a_broker_refusing_the_admin_api_is_counted_not_fatal(platform, settings, monkeypatch):
    monkeypatch.setenv("WHETSTONE_METRICS_ENABLED", "false")
    refusing, stop = refusing_broker()
    try:
        async with platform(probe_service) as p:
            rt = p["opsprobe"]
            collector = collector_of(rt, refusing, timeout_s=3)
            for _ in range(2):
                await collector.collect_once()  # never raises
            await collector.close()
            async with httpx.AsyncClient(base_url=p.url("opsprobe")) as c:
                r = await c.get("/metrics")
            assert r.status_code == 200
            assert 'whetstone_observability_errors_total{service="opsprobe",source="kafka"} 2.0' in r.text
            # the outbox half of the collector still worked
            assert 'whetstone_outbox_backlog{service="opsprobe"} 0.0' in r.text
            # and the service still consumes
            await send_event(settings.kafka_bootstrap, submitted(1), "demo")
            await handled(rt, 1)
    finally:
        stop.set()


async def test_scrapes_during_a_rebalance_never_fail(platform, settings, monkeypatch):
    monkeypatch.setenv("WHETSTONE_METRICS_INTERVAL_S", "0.2")  # the service's own collector, busy
    bootstrap = settings.kafka_bootstrap
    async with platform(probe_service) as p:
        rt = p["opsprobe"]
        statuses: list[int] = []
        stop = asyncio.Event()

        async def scrape():
            async with httpx.AsyncClient(base_url=p.url("opsprobe")) as c:
                while not stop.is_set():
                    statuses.append((await c.get("/metrics")).status_code)
                    await asyncio.sleep(0.05)

        scraping = asyncio.create_task(scrape())
        for _ in range(2):  # a second member joins the service's group, then leaves: two rebalances
            joiner = AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=rt.consumer,
                                      enable_auto_commit=False, session_timeout_ms=10000)
            await joiner.start()
            await joiner.getmany(timeout_ms=1500)
            await joiner.stop()
        await send_event(bootstrap, submitted(5), "demo")
        await handled(rt, 1)
        stop.set()
        await scraping
        assert len(statuses) > 10 and set(statuses) == {200}
        assert rt._tasks and all(not t.done() for t in rt._tasks)  # the collector task is still alive


class Broken(PromCollector):
    def describe(self):
        return []

    def collect(self):
        raise RuntimeError("a collector that fails at scrape time")


async def test_a_metric_name_collision_is_counted_and_metrics_still_render(platform, settings, monkeypatch):
    monkeypatch.setenv("WHETSTONE_METRICS_ENABLED", "false")
    async with platform(probe_service) as p:
        rt = p["opsprobe"]
        reg = rt.metrics.registry
        # another part of the service already exports a name the collector and observer want
        Gauge("whetstone_consumer_lag", "not ours", registry=reg)
        collector = collector_of(rt, settings.kafka_bootstrap)
        await collector.collect_once()  # works on, its lag gauge unexported
        await collector.close()
        assert sample(reg, "whetstone_observability_errors_total", service="opsprobe", source="collision") == 1
        # two services' observers in one registry: every name collides, nothing raises
        Observer(reg, "other")
        assert sample(reg, "whetstone_observability_errors_total", service="opsprobe", source="collision") == 1
        assert sample(reg, "whetstone_observability_errors_total", service="other", source="collision") == 2
        broken = Broken()
        reg.register(broken)
        async with httpx.AsyncClient(base_url=p.url("opsprobe")) as c:
            r1 = await c.get("/metrics")
            r2 = await c.get("/metrics")
        assert r1.status_code == r2.status_code == 200
        assert "whetstone_dlq_depth" in r2.text and "whetstone_messages_consumed_total" in r2.text
        assert 'whetstone_observability_errors_total{service="opsprobe",source="exposition"}' in r2.text
        reg.unregister(broken)
        # the service keeps working
        await send(settings.kafka_bootstrap, TOPIC, b"not json")
        await handled(rt, 1)
