"""The per-message path's bookkeeping once per fetch (consuming.py), on the real embedded stack: one
delivery count and one inbox question per fetch, lag measured once per fetch and less what was handled
since, a fetch past its time budget handed back in order, and a fetch that comes again (its first run
never finished) counted record by record."""

from __future__ import annotations

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from whetstone.contracts import TOPICS, ModelPromotedV1
from whetstone.devstack.testing import send_event, wait_until
from whetstone.runtime import db
from whetstone.runtime.service import Service

pytestmark = pytest.mark.integration
T = "demo"
TOPIC = "model.promoted"


def promoted(model_id: str) -> ModelPromotedV1:
    return ModelPromotedV1(model_id=model_id, from_stage="dev", to_stage="staging", reason="fine")


def probe(**options):
    """Records each model id it handles, with the lag of its partition as the handler saw it."""

    async def handler(rt, uow, env, ev):
        lag = await rt.measure_lag()  # the test's messages share one partition; the others hold nothing
        left = sum(max(n, 0) for (topic, _), n in (lag or {}).items() if topic == TOPIC)
        await uow.conn.execute("INSERT INTO seen (model_id, lag) VALUES ($1, $2)", ev.model_id, left)

    def build() -> Service:
        return Service(name="probe", migrations=["CREATE TABLE seen (n serial, model_id text, lag int)"],
                       subscriptions={TOPIC: handler}, **options)

    return build


async def send(bootstrap: str, model_id: str) -> None:
    await send_event(bootstrap, promoted(model_id), T, key="one-key")  # one key: one partition, in order


async def handled(rt) -> list[tuple[str, int]]:
    return [(r["model_id"], r["lag"]) for r in await rt.pool.fetch("SELECT model_id, lag FROM seen ORDER BY n")]


async def committed(bootstrap: str, group: str) -> int:
    watcher = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await watcher.start()
    try:
        offsets = [await watcher.committed(TopicPartition(TOPIC, p)) for p in range(TOPICS[TOPIC].partitions)]
        return sum(o or 0 for o in offsets)
    finally:
        await watcher.stop()


async def test_one_count_and_one_lag_measurement_per_fetch(platform, settings):
    b = settings.kafka_bootstrap
    for i in range(5):  # on the topic before the service starts: its first fetch takes all five
        await send(b, f"m{i}")
    async with platform(probe()) as p:
        rt = p["probe"]
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 5 FROM seen"), 30, "five handled")
        # each handler saw the fetch's lag less what was handled before it: itself and those after it
        assert await handled(rt) == [(f"m{i}", 5 - i) for i in range(5)]
        rows = await rt.pool.fetch('SELECT consumer, "offset", count FROM deliveries')
        assert [(r["consumer"], r["offset"], r["count"]) for r in rows] == [(rt.consumer + "#fetch", 0, 1)]
        await wait_until(lambda: _eq(committed(b, rt.consumer), 5), 30, "offsets committed")


async def _eq(aw, expected) -> bool:
    return await aw == expected


async def test_a_fetch_past_its_time_budget_hands_the_rest_back_in_order(platform, settings):
    b = settings.kafka_bootstrap
    for i in range(6):
        await send(b, f"m{i}")
    async with platform(probe(fetch_budget_s=0.0)) as p:  # every fetch handles one message, gives back the rest
        rt = p["probe"]
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 6 FROM seen"), 30, "six handled")
        assert [m for m, _ in await handled(rt)] == [f"m{i}" for i in range(6)]
        rows = await rt.pool.fetch('SELECT "offset", count FROM deliveries WHERE consumer = $1 ORDER BY 1',
                                   rt.consumer + "#fetch")
        assert [(r["offset"], r["count"]) for r in rows] == [(i, 1) for i in range(6)]  # each fetch began further on
        await wait_until(lambda: _eq(committed(b, rt.consumer), 6), 30, "offsets committed")


async def test_a_fetch_that_comes_again_is_counted_record_by_record(platform, settings):
    b = settings.kafka_bootstrap
    for i in range(3):
        await send(b, f"m{i}")
    async with platform(probe()) as p:
        rt = p["probe"]
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 3 FROM seen"), 30, "three handled")
        await wait_until(lambda: _eq(committed(b, rt.consumer), 3), 30, "offsets committed")
        consumer = rt.consumer
    # as after a crash: the fetch from offset 3 was delivered to a run that never finished it
    for i in range(3, 5):
        await send(b, f"m{i}")
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": "probe"})
    try:
        for partition in range(TOPICS[TOPIC].partitions):
            await db.count_delivery(conn, consumer + "#fetch", TOPIC, partition, 3)
    finally:
        await conn.close()
    async with platform(probe()) as p:
        rt = p["probe"]
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 5 FROM seen"), 30, "five handled")
        per_record = await rt.pool.fetch('SELECT "offset", count FROM deliveries WHERE consumer = $1 ORDER BY 1',
                                         rt.consumer)
        assert [(r["offset"], r["count"]) for r in per_record] == [(3, 1), (4, 1)]
        assert [m for m, _ in await handled(rt)] == [f"m{i}" for i in range(5)]


async def test_the_inbox_claim_and_the_owner_check_share_one_statement(platform, settings):
    """The first tenant to name a model owns it; another tenant's event about it is refused (and not
    claimed: the rollback takes the claim with it), a copy of a handled event is a duplicate."""
    b = settings.kafka_bootstrap
    async with platform(probe()) as p:
        rt = p["probe"]
        first = await send_event(b, promoted("m1"), T, times=2)  # handled once, then a duplicate
        forged = await send_event(b, promoted("m1"), "acme")
        own = await send_event(b, promoted("m2"), "acme")  # acme's own model: fine
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 2 FROM seen"), 30, "two handled")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM inbox WHERE message_id LIKE 'dlq:%'"),
                         30, "the forged event dead-lettered")
        assert sorted(m for m, _ in await handled(rt)) == ["m1", "m2"]
        owners = {r["id"]: r["tenant_id"] for r in await rt.pool.fetch("SELECT id, tenant_id FROM owners")}
        assert owners == {"m1": T, "m2": "acme"}
        inbox = {r["message_id"] for r in await rt.pool.fetch("SELECT message_id FROM inbox")}
        assert inbox == {str(first.event_id), str(own.event_id), f"dlq:{forged.event_id}"}
        refused = rt.metrics.registry.get_sample_value("whetstone_refused_total",
                                                       {"service": "probe", "reason": "tenant_mismatch"})
        assert refused == 1
