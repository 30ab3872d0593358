"""Poison cannot jam anything (issue 20 item 1), on the real embedded stack: an oversized outbox row,
tombstones and binary garbage in single and batch mode, and a record that kills its consumer. In every
case the next message is handled and the relay publishes nothing twice."""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter

import pytest

from whetstone.contracts import ModelPromotedV1
from whetstone.devstack.testing import consume_all, send, send_event, wait_until
from whetstone.runtime import db
from whetstone.runtime.service import Service

pytestmark = pytest.mark.integration
T = "demo"


def promoted(model_id: str, reason: str = "fine") -> ModelPromotedV1:
    return ModelPromotedV1(model_id=model_id, from_stage="dev", to_stage="staging", reason=reason)


def probe(batch: bool = False):
    """A service that records each model id it sees and, for reason `echo`, re-publishes the event;
    for reason `huge`, publishes an event of 1.2 MB (larger than the producer takes)."""

    async def handler(rt, uow, env, ev):
        await uow.conn.execute("INSERT INTO seen VALUES ($1)", ev.model_id)
        if ev.reason in ("echo", "huge"):
            reason = "x" * 1_200_000 if ev.reason == "huge" else "echoed"
            await uow.publish(ModelPromotedV1(model_id=ev.model_id + "-out", from_stage="staging",
                                              to_stage="production", reason=reason), tenant_id=env.tenant_id,
                              topic="model.registered.dlq")  # a topic the probe does not consume

    async def batch_handler(rt, uow, deliveries):
        for d in deliveries:
            await handler(rt, uow, d.envelope, d.event)

    def build() -> Service:
        return Service(name="probe", migrations=["CREATE TABLE seen (model_id text)"],
                       subscriptions={"model.promoted": handler},
                       batch_handler=batch_handler if batch else None, batch_size=50)

    return build


async def seen(rt) -> list[str]:
    return [r["model_id"] for r in await rt.pool.fetch("SELECT model_id FROM seen ORDER BY model_id")]


async def letters(bootstrap: str, n: int) -> list[dict]:
    async def enough():
        got = [json.loads(v) for v in await consume_all(bootstrap, "model.promoted.dlq", timeout=1.0)]
        return got if len(got) >= n else None
    return await wait_until(enough, 30, f"{n} dead letters")


async def test_an_oversized_outbox_row_is_quarantined_and_nothing_is_published_twice(platform, settings):
    b = settings.kafka_bootstrap
    async with platform(probe()) as p:
        rt = p["probe"]
        await send_event(b, promoted("m1", "echo"), T)
        await send_event(b, promoted("m2", "huge"), T)
        await send_event(b, promoted("m3", "echo"), T)
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 3 FROM seen"), 30, "three handled")
        await wait_until(lambda: rt.pool.fetchval(
            "SELECT count(*) = 1 FROM outbox WHERE quarantined_at IS NOT NULL"), 30, "the huge row quarantined")
        await wait_until(lambda: rt.pool.fetchval(
            "SELECT count(*) = 2 FROM outbox WHERE sent_at IS NOT NULL"), 30, "the other rows sent")
        row = await rt.pool.fetchrow("SELECT * FROM outbox WHERE quarantined_at IS NOT NULL")
        assert "exceeds the producer's limit" in row["last_error"] and row["sent_at"] is None
        # several relay cycles later, each event is on the topic exactly once
        for _ in range(3):
            await rt.relay.flush_once()
        published = [json.loads(v) for v in await consume_all(b, "model.registered.dlq", timeout=2.0)]
        ids = Counter(e["event_id"] for e in published)
        assert sorted(e["payload"]["model_id"] for e in published) == ["m1-out", "m3-out"]
        assert set(ids.values()) == {1}


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
async def test_tombstones_and_binary_garbage_are_dead_lettered_bounded_and_the_next_message_handled(
        platform, settings, batch):
    b = settings.kafka_bootstrap
    garbage = bytes(range(256)) * 800  # 200 KB of control and non-UTF-8 bytes
    async with platform(probe(batch)) as p:
        rt = p["probe"]
        await send(b, "model.promoted", None, key="m1")  # a tombstone
        await send(b, "model.promoted", garbage, key="m1")
        await send_event(b, promoted("m1"), T)
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM seen"), 30, "the good message")
        got = await letters(b, 2)
        by_error = {x["payload"]["error"].split(":")[0]: x["payload"] for x in got}
        assert set(by_error) == {"tombstone", "malformed message"}, by_error.keys()
        bad = by_error["malformed message"]
        assert bad["value_encoding"] == "base64" and bad["value_truncated"] is True
        assert bad["value_bytes"] == len(garbage) and bad["value_sha256"] == hashlib.sha256(garbage).hexdigest()
        assert base64.b64decode(bad["value"]) == garbage[:64 * 1024]
        assert all(len(json.dumps(x)) < 200_000 for x in got)
        assert by_error["tombstone"]["value_bytes"] == 0


async def test_a_record_that_keeps_killing_its_consumer_is_dead_lettered_after_n_deliveries(platform, settings):
    """The delivery counts live in Postgres, outside the handler's transaction: we play the part of
    the earlier crashed runs by recording their deliveries, then deliver the record once more. A
    fetch is counted by its first offset; its first run counts nothing per record, each later run
    (the fetch came again: offsets were never committed) counts each record before its handler."""
    b = settings.kafka_bootstrap
    m = settings.max_crash_deliveries
    async with platform(probe()) as p:
        rt = p["probe"]
        await send_event(b, promoted("m0"), T)  # offset 0 of its partition is handled normally
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM seen"), 30, "first message")
        partition = await rt.pool.fetchval("SELECT partition FROM deliveries WHERE topic = 'model.promoted'")
        for run in range(m):  # the runs that died while handling offset 1, the first of their fetch
            await db.count_delivery(rt.pool, rt.consumer + "#fetch", "model.promoted", partition, 1)
            if run:
                await db.count_delivery(rt.pool, rt.consumer, "model.promoted", partition, 1)
        await send_event(b, promoted("m0", "crashes"), T)  # same key: same partition, offset 1
        await send_event(b, promoted("m0-next"), T)
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 2 FROM seen"), 30, "the message after it")
        (letter,) = await letters(b, 1)
        assert "without completing" in letter["payload"]["error"]
        assert letter["payload"]["attempts"] == settings.max_crash_deliveries + 1
        assert await seen(rt) == ["m0", "m0-next"]
