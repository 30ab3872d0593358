"""Tenant rates shared by two gateway replicas on one database, and set only by the operator
(real scheduler, real PostgreSQL of the embedded stack): requests spread over both replicas draw
on one bucket of the tenant's; a tenant's admin key can neither change its rate through the
operator route nor go faster with a key of a higher rate; the operator's override reaches the
other replica, and its removal brings the deployment's rate back."""

import asyncio
import time

import httpx
import pytest

from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway

pytestmark = pytest.mark.integration
JOBS = "/v1/fine_tuning/jobs"
LIMITS = "/v1/operator/rate_limits"


async def spread(clients: list[httpx.AsyncClient], headers: dict, n: int) -> tuple[list[int], float]:
    """`n` requests, one after another, alternating over the replicas: their codes and how long they took."""
    t0 = time.monotonic()
    codes = [(await clients[i % len(clients)].get(JOBS, headers=headers)).status_code for i in range(n)]
    return codes, time.monotonic() - t0


async def test_two_replicas_share_the_tenant_rate_and_only_the_operator_changes_it(platform, settings):
    from whetstone.cli.keys import create_key
    from whetstone.scheduler.bootstrap import build_service as scheduler

    # each replica believes there are two (so without a shared bucket each would hold 1.5/s of the 3/s)
    edge = GatewaySettings(tenant_rate_limit_per_s=3, rate_limit_burst_s=1, replicas=2, limits_ttl_s=0.3)
    async with platform(scheduler) as p:
        sched = p.url("scheduler")
        gws = [await start_gateway(edge, {"scheduler": sched}, port=0, database_url=settings.database_url)
               for _ in range(2)]
        try:
            admin, op, other = [await asyncio.to_thread(create_key, t, scopes=["admin"], base_url=sched)
                                for t in ("demo", "platform", "acme")]
            demo, operator, acme = ({"Authorization": f"Bearer {k['key']}"} for k in (admin, op, other))
            async with httpx.AsyncClient(base_url=gws[0].url, timeout=30) as c0, \
                    httpx.AsyncClient(base_url=gws[1].url, timeout=30) as c1:
                clients = [c0, c1]
                # one bucket of 3 (refilled at 3/s) for both replicas; a bucket per replica would pass about
                # twice as many, and 1/replicas of the rate in each would refuse the third request
                codes, elapsed = await spread(clients, demo, 12)
                assert codes[:3] == [200, 200, 200], codes
                assert set(codes) <= {200, 429} and codes.count(200) <= 3 + 3 * elapsed + 1, (codes, elapsed)
                assert (await c1.get(JOBS, headers=acme)).status_code == 200   # another tenant: its own bucket

                # the tenant's own admin key cannot raise its rate, on either replica (3 requests: the bucket refilled)
                await asyncio.sleep(1.2)
                for c in clients:
                    r = await c.put(f"{LIMITS}/demo", headers=demo, json={"requests_per_s": 1000})
                    assert r.status_code == 403 and r.json()["error"]["code"] == "operator_only", r.text
                assert (await c1.get(LIMITS, headers=demo)).status_code == 403
                # nor go faster with a key of its own at 1000/s: the tenant's 3/s still holds
                await asyncio.sleep(1.2)
                fast = await c0.post("/v1/keys", headers=demo, json={"name": "fast", "rate_limit_per_s": 1000})
                assert fast.status_code == 200, fast.text
                codes, elapsed = await spread(clients, {"Authorization": f"Bearer {fast.json()['key']}"}, 12)
                assert codes.count(200) <= 3 + 3 * elapsed + 1, (codes, elapsed)

                # the operator raises it on one replica; the other applies it within limits_ttl_s
                r = await c0.put(f"{LIMITS}/demo", headers=operator, json={"requests_per_s": 50})
                assert r.status_code == 200, r.text
                assert r.json()["requests_per_s"] == 50 and r.json()["set_by"] == op["id"]
                bad = await c0.put(f"{LIMITS}/demo", headers=operator, json={"requests_per_s": -1})
                assert bad.status_code == 400 and bad.json()["error"]["param"] == "requests_per_s", bad.text
                listed = (await c1.get(LIMITS, headers=operator)).json()
                assert [x["tenant_id"] for x in listed["data"]] == ["demo"] and listed["object"] == "list"
                await asyncio.sleep(1.2)   # past limits_ttl_s, and the bucket refills
                codes, _ = await spread(clients, demo, 12)
                assert codes == [200] * 12, codes

                # removed: back to the deployment's 3/s
                assert (await c1.delete(f"{LIMITS}/demo", headers=operator)).json()["deleted"] is True
                assert (await c1.delete(f"{LIMITS}/demo", headers=operator)).status_code == 404
                await asyncio.sleep(0.5)
                codes, elapsed = await spread(clients, demo, 12)
                assert 429 in codes and codes.count(200) <= 3 + 3 * elapsed + 1, (codes, elapsed)
        finally:
            for gw in gws:
                await gw.stop()
