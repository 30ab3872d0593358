"""Per-delivery trace rows and `GET /internal/trace` on the real embedded stack: one service, one
consumer handling events one by one and another in batches; each answers with its own deliveries of
a job's events (lag and handler time non-negative), nothing of another tenant to a tenant's admin,
and a clear 400/401/403 for a bad query."""

from __future__ import annotations

import httpx
import pytest

from whetstone.contracts import JobProgressV1, ModelPromotedV1
from whetstone.devstack.testing import send, send_event, wait_until
from whetstone.runtime.identity import IdentityAuth, InternalAuth
from whetstone.runtime.service import Service

pytestmark = pytest.mark.integration
JOB = "ftjob-" + "a" * 24


def build(name: str, batch: bool):
    async def handler(rt, uow, env, ev):
        if getattr(ev, "reason", "") == "boom":
            raise ValueError("boom")

    async def batch_handler(rt, uow, deliveries):
        for d in deliveries:
            await handler(rt, uow, d.envelope, d.event)

    return lambda: Service(name=name, subscriptions={"job.progress": handler, "model.promoted": handler},
                           batch_handler=batch_handler if batch else None)


async def test_each_service_answers_its_deliveries_of_a_job(settings, platform):
    async with platform(build("one", False), build("many", True)) as p:
        bootstrap = settings.kafka_bootstrap
        first = await send_event(bootstrap, JobProgressV1(job_id=JOB, segment_id="s1", step=1), "demo")
        await send_event(bootstrap, JobProgressV1(job_id=JOB, segment_id="s1", step=2), "demo",
                         trace_id=first.trace_id, times=2)  # a duplicate: traced once
        await send_event(bootstrap, JobProgressV1(job_id="ftjob-" + "b" * 24, segment_id="s9", step=1), "other")
        poison = await send_event(bootstrap, ModelPromotedV1(model_id="m1", from_stage="dev", to_stage="staging",
                                                             reason="boom"), "demo", trace_id=first.trace_id)
        await send(bootstrap, "job.progress", b"{garbage", key=JOB)  # no envelope: nothing to trace

        async with httpx.AsyncClient(timeout=10) as c:
            async def rows(svc: str, n: int, **params):
                r = await c.get(p.url(svc) + "/internal/trace", params=params, auth=InternalAuth())
                assert r.status_code == 200, r.text
                data = r.json()["data"]
                return data if len(data) >= n else None

            for svc in ("one", "many"):
                data = await wait_until(lambda: rows(svc, 2, job_id=JOB), 30, f"{svc}'s deliveries of the job")
                assert [d["event_type"] for d in data] == ["job.progress", "job.progress"]
                assert all(d["consumer"] == f"whetstone-{svc}" and d["outcome"] == "handled" for d in data)
                assert all(d["lag_s"] >= 0 and d["handler_s"] >= 0 for d in data)
                assert data[0]["consumed_at"] <= data[1]["consumed_at"]
                assert data[0]["event_id"] == str(first.event_id) and data[0]["producer"] == "test"
                # by trace: the dead-lettered poison shares the trace
                traced = await wait_until(lambda: rows(svc, 3, trace_id=first.trace_id), 30, "the poison's row")
                assert {(d["event_type"], d["outcome"]) for d in traced} == {
                    ("job.progress", "handled"), ("model.promoted", "dead_lettered")}
                assert str(poison.event_id) in {d["event_id"] for d in traced}

            # a tenant's admin sees its own deliveries only
            r = await c.get(p.url("one") + "/internal/trace", params={"job_id": "ftjob-" + "b" * 24},
                            auth=IdentityAuth("demo", ("admin",)))
            assert r.status_code == 200 and r.json()["data"] == []
            r = await c.get(p.url("one") + "/internal/trace", params={"job_id": "ftjob-" + "b" * 24},
                            auth=IdentityAuth("other", ("admin",)))
            assert [d["tenant_id"] for d in r.json()["data"]] == ["other"]
            # bad queries
            r = await c.get(p.url("one") + "/internal/trace", auth=InternalAuth())
            assert r.status_code == 400 and r.json()["error"]["param"] == "job_id"
            r = await c.get(p.url("one") + "/internal/trace", params={"job_id": JOB},
                            auth=IdentityAuth("demo", ("read", "write")))
            assert r.status_code == 403
            r = await c.get(p.url("one") + "/internal/trace", params={"job_id": JOB})
            assert r.status_code == 401
            r = await c.get(p.url("one") + "/internal/trace", params={"job_id": "x" * 500},
                            auth=InternalAuth())
            assert 400 <= r.status_code < 500 and "job_id" in r.text
