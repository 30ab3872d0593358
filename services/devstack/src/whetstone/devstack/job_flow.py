"""One fine-tuning job from request to usage, straight at the service ports: what the end-to-end
tests (tests/e2e/test_full_flow.py, tests/ops/test_dashboards_prometheus.py) drive. Users go through
the public API instead (`whet jobs create --follow`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from whetstone.runtime.identity import IdentityAuth

TERMINAL = ("succeeded", "failed", "cancelled")


async def wait_for(fetch: Callable[[], Awaitable[httpx.Response]], what: str, timeout_s: float = 60) -> Any:
    """The first 200 answer that is not an empty list or an open usage record (no `total` yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = await fetch()
        body = r.json() if r.status_code == 200 else None
        if isinstance(body, dict) and body.get("data", True) and body.get("total", True):
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not available after {timeout_s}s: {r.status_code} {r.text[:200]}")
        await asyncio.sleep(0.3)


async def create_and_follow(ports: dict[str, int], tenant_id: str, body: dict[str, Any], key: str,
                            timeout_s: float = 600) -> dict[str, Any]:
    """Create the job with a signed identity (what the gateway adds), wait for its outcome, then its
    model (when it succeeded) and its closed usage. Returns the API's JSON: {job, model?, usage}."""

    def url(svc: str) -> str:
        return f"http://127.0.0.1:{ports[svc]}"

    async with httpx.AsyncClient(timeout=30, auth=IdentityAuth(tenant_id, ("read", "write"))) as c:
        r = await c.post(url("scheduler") + "/v1/fine_tuning/jobs", json=body,
                         headers={"Idempotency-Key": key})
        if r.status_code != 200:
            raise SystemExit(f"job rejected ({r.status_code}): {r.text}")
        job_id, deadline = r.json()["id"], time.monotonic() + timeout_s
        while True:
            job = (await c.get(url("scheduler") + f"/v1/fine_tuning/jobs/{job_id}")).json()
            if job["status"] in TERMINAL:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s}s")
            await asyncio.sleep(0.5)
        result: dict[str, Any] = {"job": job}
        if job["status"] == "succeeded":
            models = await wait_for(lambda: c.get(url("registry") + "/v1/models", params={"job_id": job_id}), "model")
            result["model"] = models["data"][0]
        result["usage"] = await wait_for(lambda: c.get(url("metering") + f"/v1/usage/jobs/{job_id}"), "usage")
    return result
