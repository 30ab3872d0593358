"""The gateway in front of real services on a real embedded stack: keys, forged identities,
signatures bound to their request (method, target, body, 60 s), revocation within seconds, rate
limits, unconfigured upstreams."""

import asyncio
import time

import httpx
import pytest

from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway
from whetstone.runtime.identity import IDENTITY_HEADER, SIGNATURE_HEADER, identity_headers, internal_headers
from whetstone.runtime.signing import Bound

pytestmark = pytest.mark.integration


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


async def test_keys_gateway_forgery_revocation_and_limits(platform):
    from whetstone.cli.keys import create_key, operator_call
    from whetstone.registry.bootstrap import build_service as registry
    from whetstone.scheduler.bootstrap import build_service as scheduler

    async with platform(scheduler, registry) as p:
        sched = p.url("scheduler")
        gw = await start_gateway(GatewaySettings(), {"scheduler": sched, "registry": p.url("registry")}, port=0)
        try:
            demo = await asyncio.to_thread(create_key, "demo", name="ci", base_url=sched)
            acme = await asyncio.to_thread(create_key, "acme", scopes=["read"], rate_limit=1.0, base_url=sched)
            assert demo["key"].startswith("wsk-") and demo["tenant_id"] == "demo" and demo["scopes"] == ["read", "write"]
            # the secret is stored only as a hash: never listed back
            listed = await asyncio.to_thread(operator_call, "GET", "/v1/keys", base_url=sched)
            assert demo["key"] not in str(listed) and {k["id"] for k in listed["data"]} >= {demo["id"], acme["id"]}
            assert list(demo) == ["id", "object", "tenant_id", "name", "scopes", "created_at", "last_used_at",
                                  "revoked_at", "rate_limit_per_s", "status", "key"]
            assert {k: v for k, v in demo.items() if k != "key"} in listed["data"] and demo["object"] == "api_key"
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
                auth = {"Authorization": f"Bearer {demo['key']}"}
                assert (await c.get("/healthz")).status_code == 200
                # no key, a wrong key, a malformed key: 401 invalid_api_key in OpenAI's shape
                for headers in ({}, {"Authorization": "Bearer wsk-000000000000-" + "0" * 48},
                                {"Authorization": "Bearer sk-nonsense"}, {"Authorization": demo["key"]}):
                    r = await c.get("/v1/models", headers=headers)
                    assert r.status_code == 401 and _error(r)["code"] == "invalid_api_key"
                    assert r.headers["x-should-retry"] == "false"
                r = await c.get("/v1/models", headers=auth)
                assert r.status_code == 200 and r.json()["object"] == "list"
                # what the gateway signs, the services accept: a query with %-escapes, a JSON body
                r = await c.get("/v1/models?after=a%20b%2Fc&limit=2", headers=auth)
                assert r.status_code == 200, r.text
                r = await c.post("/v1/fine_tuning/jobs", headers={**auth, "Idempotency-Key": "gw-signed"},
                                 json={"model": "no-such-model", "training_file": "file-x", "suffix": "é x"})
                assert r.status_code not in (401, 403) and _error(r)["code"] != "invalid_identity", r.text
                # whatever identity a caller sends through the gateway is dropped and replaced by its key's
                forged = identity_headers("acme", ("admin",), bound=Bound.of("GET", "/v1/keys", b""))
                r = await c.get("/v1/keys", headers={**auth, **forged, "X-Tenant-Id": "acme"})
                assert r.status_code == 403 and _error(r)["code"] == "insufficient_scope"  # demo's key has no admin
                # an unknown route and a route whose service is not deployed
                assert (await c.get("/internal/keys/verify", headers=auth)).status_code == 404
                r = await c.post("/v1/chat/completions", headers=auth, json={"model": "x", "messages": []})
                assert r.status_code == 503 and _error(r)["code"] == "service_unavailable"
                # rate limit: acme's key allows 1 request/s (burst 2)
                acme_auth = {"Authorization": f"Bearer {acme['key']}"}
                codes = [(await c.get("/v1/models", headers=acme_auth)) for _ in range(4)]
                limited = [r for r in codes if r.status_code == 429]
                assert limited and int(limited[0].headers["retry-after"]) >= 1
                assert _error(limited[0])["type"] == "rate_limit_error"
                # revoked: refused within the verdict cache's lifetime (<= 2 s), on every route
                await asyncio.to_thread(operator_call, "POST", f"/v1/keys/{demo['id']}/revoke", base_url=sched)
                began = time.monotonic()
                while (await c.get("/v1/models", headers=auth)).status_code == 200:
                    assert time.monotonic() - began < 5, "revoked key still accepted after 5 s"
                    await asyncio.sleep(0.2)
                assert time.monotonic() - began <= 3.0
                r = await c.get("/v1/fine_tuning/jobs", headers=auth)
                assert r.status_code == 401 and _error(r)["code"] == "invalid_api_key"
            # straight to a service port: no identity, X-Tenant-Id, a forged, expired, replayed or moved
            # signature -> 401
            async with httpx.AsyncClient(timeout=30) as c:
                for base in (p.url("registry"), sched):
                    path = "/v1/models" if base != sched else "/v1/keys"
                    get = Bound.of("GET", path, b"")
                    bad_sig = {IDENTITY_HEADER: "tenant=demo;key=x;scopes=admin,read,write;ts=%d" % time.time(),
                               SIGNATURE_HEADER: "0" * 64}
                    stale = identity_headers("demo", ("admin",), bound=get, now=time.time() - 3600)
                    replayed = identity_headers("demo", ("admin",), bound=get, now=time.time() - 90)
                    wrong_secret = identity_headers("demo", ("admin",), bound=get, secret=b"not-the-platform-secret")
                    other_path = identity_headers("demo", ("admin",), bound=Bound.of("GET", path + "/x", b""))
                    other_method = identity_headers("demo", ("admin",), bound=Bound.of("DELETE", path, b""))
                    other_query = identity_headers("demo", ("admin",), bound=Bound.of("GET", path + "?limit=1", b""))
                    for headers in ({}, {"X-Tenant-Id": "demo"}, bad_sig, stale, replayed, wrong_secret, other_path,
                                    other_method, other_query):
                        r = await c.get(base + path, headers=headers)
                        assert r.status_code == 401, (base, headers, r.text)
                        _error(r)
                    assert (await c.get(base + path, headers=identity_headers("demo", ("admin",), bound=get))
                            ).status_code == 200                                  # the same request, signed for it
                # the key service's verify route takes only the internal secret, never a tenant identity
                verify, body = "/internal/keys/verify", b'{"key": "%s"}' % acme["key"].encode()
                json_type = {"Content-Type": "application/json"}
                r = await c.post(sched + verify, content=body,
                                 headers={**json_type, **identity_headers("acme", ("admin",),
                                                                          bound=Bound.of("POST", verify, body))})
                assert r.status_code == 401
                # an internal signature covers the body: the same call with another key's body is refused
                signed = internal_headers(Bound.of("POST", verify, body))
                other = b'{"key": "%s"}' % demo["key"].encode()
                assert (await c.post(sched + verify, content=other, headers={**json_type, **signed})).status_code == 401
                assert (await c.post(sched + "/v1/keys", content=body, headers={**json_type, **signed})
                        ).status_code == 401                                      # moved to another route
                r = await c.post(sched + verify, content=body, headers={**json_type, **signed})
                assert r.status_code == 200 and r.json()["tenant_id"] == "acme", r.text
        finally:
            await gw.stop()
        # the public /healthz names which upstream is down, never why (no status, no error's name)
        down = await start_gateway(GatewaySettings(), {"scheduler": sched, "registry": "http://127.0.0.1:9"}, port=0)
        try:
            async with httpx.AsyncClient(base_url=down.url, timeout=30) as c:
                r = await c.get("/healthz")
            assert r.json()["upstreams"] == {"scheduler": "ok", "registry": "unavailable"}, r.text
            assert "Error" not in r.text and "127.0.0.1" not in r.text and "status" not in r.json()["upstreams"].values()
        finally:
            await down.stop()
