"""`whet dlq redrive`: a letter replayed after the fix is handled once through the normal inbox."""

import pytest

from whetstone.cli.dlq import read_letters, redrive
from whetstone.contracts import ModelPromotedV1
from whetstone.devstack.testing import send, send_event, wait_until
from whetstone.runtime.service import Service

pytestmark = pytest.mark.integration


async def test_redrive_after_a_fix_has_one_effect_and_skips_what_cannot_be_replayed(platform, settings):
    broken = {"on": True}

    async def handler(rt, uow, env, ev):
        if broken["on"]:
            raise RuntimeError("bug, fixed later")
        await uow.conn.execute("INSERT INTO seen VALUES ($1)", ev.model_id)

    def probe() -> Service:
        return Service(name="probe", migrations=["CREATE TABLE seen (model_id text)"],
                       subscriptions={"model.promoted": handler})

    b = settings.kafka_bootstrap
    async with platform(probe) as p:
        rt = p["probe"]
        env = await send_event(b, ModelPromotedV1(model_id="m1", from_stage="dev", to_stage="staging", reason="r"),
                               "demo")
        await send(b, "model.promoted", b"\x00not an envelope", key="m2")

        async def two_letters():
            got = await read_letters(b, "model.promoted.dlq", timeout_s=1.0)
            return got if len(got) == 2 else None

        letters = await wait_until(two_letters, 30, "two dead letters")
        assert [x.event_id for x in letters if x.replayable is None] == [str(env.event_id)]
        broken["on"] = False
        first = await redrive(b, "model.promoted", letters)
        assert first["redriven"] == 1 and len(first["skipped"]) == 1
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM seen"), 30, "the redriven event handled")
        again = await redrive(b, "model.promoted", letters)  # an operator replays twice
        assert again["redriven"] == 1

        async def settled():
            m = rt.metrics.registry.get_sample_value
            return (m("whetstone_messages_consumed_total",
                      {"service": "probe", "topic": "model.promoted", "outcome": "duplicate"}) or 0) >= 1
        await wait_until(settled, 30, "the second replay absorbed")
        assert await rt.pool.fetchval("SELECT count(*) FROM seen") == 1
