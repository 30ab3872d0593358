"""Two replicas of one service, two outbox relays on one outbox: each row is published once and the
events of every key reach the topic in the order they were committed (issue 20 item 5)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaProducer

from whetstone.devstack.testing import consume_all
from whetstone.runtime import db
from whetstone.runtime.messaging import OutboxRelay

pytestmark = pytest.mark.integration
TOPIC = "model.promoted"


async def test_two_relays_publish_each_row_once_in_per_key_order(settings):
    pool = await db.create_pool(settings.database_url, "replicated")
    await db.migrate(pool, "replicated", [])
    producers = [AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all") for _ in range(2)]
    for p in producers:
        await p.start()

    def sender(producer: AIOKafkaProducer):
        async def send(topic: str, key: str, value: bytes):
            delivered = await producer.send(topic, value, key=key.encode())
            await asyncio.sleep(0)  # let the other relay run in between, as a second process would
            return delivered
        return send

    lock = db.lock_key("replicated", "outbox-relay")
    relays = [OutboxRelay(pool, sender(p), batch=7, lock_key=lock) for p in producers]
    try:
        rows = [(TOPIC, f"k{i % 5}", json.dumps({"seq": i, "key": f"k{i % 5}"}).encode()) for i in range(400)]
        for start in range(0, len(rows), 50):  # committed in several transactions, as handlers would
            async with pool.acquire() as conn:
                await conn.copy_records_to_table("outbox", records=rows[start:start + 50],
                                                 columns=("topic", "key", "value"))

        async def drain(relay: OutboxRelay) -> None:
            while await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL"):
                await relay.flush_once()
                await asyncio.sleep(0)

        await asyncio.gather(*(drain(r) for r in relays))
        assert sum(r.published for r in relays) == 400
        assert all(r.published > 0 for r in relays), "both replicas took turns"
        got = [json.loads(v) for v in await consume_all(settings.kafka_bootstrap, TOPIC, timeout=3.0)]
        assert sorted(x["seq"] for x in got) == list(range(400)), "each row exactly once"
        for k in range(5):
            seqs = [x["seq"] for x in got if x["key"] == f"k{k}"]
            assert seqs == sorted(seqs), f"key k{k} out of order"
    finally:
        for p in producers:
            await p.stop()
        await pool.close()
