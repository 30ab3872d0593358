"""Public API benchmark (issue 15): 50 tenants with API keys submit 10,000 fine-tuning jobs through
the gateway as fast as it takes them, on the embedded stack. Half the submissions carry an
Idempotency-Key; 10 % of all calls are retries of an earlier keyed call (same key, same body).
A baseline in the same run sends the same kind of load straight to the scheduler's port (signed
identity, no gateway), so the gateway's cost is visible.

    .venv/bin/python bench/api.py [--jobs 10000] [--tenants 50] [--concurrency 16] [--baseline-jobs 2000]

Every answer is checked: 200 (a job of this tenant) or 429 `concurrency_quota_exceeded`; a keyed
retry must return the job of its first answer. Last line: one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx

TIERS = {"free": 2, "standard": 20, "premium": 100}   # max_in_flight per tier (scheduler defaults)
# the scheduler and the gateway in processes of their own, as deployed (the gateway is stateless)
SERVE_SCHEDULER = """
import asyncio
from whetstone.runtime.service import run_services
from whetstone.runtime.lifecycle import freeze_startup_objects
from whetstone.scheduler.bootstrap import build_service
asyncio.run(run_services([build_service()], ready=lambda rts: (freeze_startup_objects(), print("ready", flush=True))))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_processes(*procs: subprocess.Popen) -> None:
    """Terminate each process, killing the ones still up 30 s later."""
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class Tally:
    def __init__(self) -> None:
        self.create_ms: list[float] = []
        self.get_ms: list[float] = []
        self.by_status: dict[int, int] = defaultdict(int)
        self.wrong: list[str] = []
        self.admitted: dict[str, set[str]] = defaultdict(set)   # tenant -> job ids
        self.key_jobs: dict[tuple[str, str], set[str]] = defaultdict(set)  # (tenant, key) -> job ids answered
        self.transport_errors = 0

    def check(self, tenant: str, key: str | None, r: Answer) -> None:
        self.by_status[r.status] += 1
        if r.status == 200:
            job = r.body
            if job.get("organization_id", tenant) != tenant or not job.get("id"):
                self.wrong.append(f"job of another tenant: {job.get('id')}")
            self.admitted[tenant].add(job["id"])
            if key:
                self.key_jobs[(tenant, key)].add(job["id"])
        elif r.status == 429:
            if r.code not in ("concurrency_quota_exceeded", "rate_limit_exceeded"):
                self.wrong.append(f"429 {r.code}")
        else:
            self.wrong.append(f"{r.status} {json.dumps(r.body)[:200]}")


@dataclass
class Answer:
    status: int
    body: Any
    retry_after: str | None

    @property
    def code(self) -> str | None:
        return ((self.body or {}).get("error") or {}).get("code") if isinstance(self.body, dict) else None


async def call(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> Answer:
    """The load generator's client: aiohttp (an httpx client costs this 2-core machine about 1.7 ms
    of CPU per request, which the server under test then lacks)."""
    async with session.request(method, url, **kw) as r:
        try:
            body = await r.json(content_type=None)
        except ValueError:
            body = {"unparsed": (await r.text())[:200]}
        return Answer(r.status, body, r.headers.get("retry-after"))


async def wait_healthy(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as c:
        while True:
            try:
                if (await c.get(url, timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} not healthy after {timeout_s}s")
            await asyncio.sleep(0.2)


def plan(n: int, tenants: list[str], seed: int) -> list[tuple[str, str | None, bool]]:
    """(tenant, idempotency key or None, is_retry) in submission order."""
    rng = random.Random(seed)
    calls: list[tuple[str, str | None, bool]] = []
    keyed: list[tuple[str, str]] = []
    for i in range(n):
        if keyed and rng.random() < 0.10:
            tenant, key = rng.choice(keyed)
            calls.append((tenant, key, True))
            continue
        tenant = tenants[i % len(tenants)]
        key = f"bench-{seed}-{i}" if rng.random() < 0.5 else None
        if key:
            keyed.append((tenant, key))
        calls.append((tenant, key, False))
    return calls


async def load(base: str, headers_for, calls, concurrency: int, body: dict) -> tuple[Tally, float]:
    """`headers_for(tenant, method, path, body)`: the auth headers of one call (a signature binds the
    method, the path and the body)."""
    tally = Tally()
    payload = json.dumps(body).encode()
    queue: asyncio.Queue = asyncio.Queue()
    for c in calls:
        queue.put_nowait(c)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base_url=base, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as client:
        async def worker() -> None:
            while not queue.empty():
                tenant, key, _ = queue.get_nowait()
                headers = {**headers_for(tenant, "POST", "/v1/fine_tuning/jobs", payload), "Content-Type": "application/json"}
                if key:
                    headers["Idempotency-Key"] = key
                began = time.perf_counter()
                try:
                    r = await call(client, "POST", "/v1/fine_tuning/jobs", data=payload, headers=headers)
                except (aiohttp.ClientConnectionError, asyncio.TimeoutError):   # the client retries, as SDKs do
                    tally.transport_errors += 1
                    queue.put_nowait((tenant, key, True))
                    continue
                if r.status == 429 and r.code == "rate_limit_exceeded":
                    await asyncio.sleep(float(r.retry_after or "1"))
                    queue.put_nowait((tenant, key, True))
                    continue
                tally.create_ms.append((time.perf_counter() - began) * 1000)
                tally.check(tenant, key, r)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
        # reads: a sample of the admitted jobs, through the same path
        sample = [(t, j) for t, jobs in tally.admitted.items() for j in list(jobs)[:10]]

        async def read(tenant: str, job_id: str) -> None:
            t0 = time.perf_counter()
            path = f"/v1/fine_tuning/jobs/{job_id}"
            r = await call(client, "GET", path, headers=headers_for(tenant, "GET", path, b""))
            tally.get_ms.append((time.perf_counter() - t0) * 1000)
            if r.status >= 500:
                tally.by_status[r.status] += 1
        for i in range(0, len(sample), concurrency):
            await asyncio.gather(*(read(t, j) for t, j in sample[i:i + concurrency]))
    return tally, elapsed


def summary(tally: Tally, elapsed: float, caps: dict[str, int]) -> dict:
    over = sum(max(0, len(jobs) - caps[t]) for t, jobs in tally.admitted.items())
    duplicates = sum(len(ids) - 1 for ids in tally.key_jobs.values() if len(ids) > 1)
    answered = len(tally.create_ms)
    return {"submissions": answered, "submissions_per_s": round(answered / elapsed, 1),
            "create_p50_ms": round(pct(tally.create_ms, 50), 1), "create_p99_ms": round(pct(tally.create_ms, 99), 1),
            "get_p99_ms": round(pct(tally.get_ms, 99), 1),
            "admitted": sum(len(v) for v in tally.admitted.values()), "over_admitted": over,
            "duplicate_jobs": duplicates, "errors_5xx": sum(n for s, n in tally.by_status.items() if s >= 500),
            "wrong_answers": len(tally.wrong), "transport_errors": tally.transport_errors,
            "status_counts": dict(sorted(tally.by_status.items()))}


async def run(args: argparse.Namespace) -> dict:
    from whetstone.contracts import all_topic_partitions
    from whetstone.devstack.stack import EmbeddedStack
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.identity import identity_headers, internal_secret
    from whetstone.runtime.signing import Bound

    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    tier_names = list(TIERS)
    tenants = {f"t{i:02d}": tier_names[i % 3] for i in range(args.tenants)}
    stack = EmbeddedStack(tmp / "stack", topics=all_topic_partitions(), buckets=["whetstone"], log=lambda m: None)
    endpoints = stack.start()
    env = {**os.environ, **endpoints.as_env(), "WHETSTONE_DATA_DIR": str(tmp), "WHETSTONE_TENANTS": json.dumps(tenants),
           "WHETSTONE_LOG_LEVEL": "WARNING", "WHETSTONE_SCHEDULER_UNKNOWN_DATASET_GRACE_S": "36000",
           "WHETSTONE_SCHEDULER_DATASET_WAIT_S": "36000"}
    sched_port, api_port = free_port(), free_port()
    env.update(WHETSTONE_SCHEDULER_HTTP_PORT=str(sched_port), WHETSTONE_API_PORT=str(api_port))
    os.environ.update({k: env[k] for k in ("WHETSTONE_DATA_DIR", "WHETSTONE_TENANTS")})
    build_tiny_model(tmp / "models" / "tiny-llama")
    env["WHETSTONE_GATEWAY_UPSTREAMS"] = json.dumps({"scheduler": f"http://127.0.0.1:{sched_port}"})
    server = subprocess.Popen([sys.executable, "-c", SERVE_SCHEDULER], env=env, stdout=subprocess.PIPE, text=True)
    edge = subprocess.Popen([sys.executable, "-m", "whetstone.gateway"], env=env)
    try:
        assert server.stdout is not None
        line = await asyncio.to_thread(server.stdout.readline)
        if "ready" not in line:
            raise SystemExit(f"scheduler did not start: {line!r}")
        await wait_healthy(f"http://127.0.0.1:{api_port}/healthz")
        sched, gateway = f"http://127.0.0.1:{sched_port}", f"http://127.0.0.1:{api_port}"
        from whetstone.cli.keys import create_key
        keys = {t: (await asyncio.to_thread(create_key, t, base_url=sched))["key"] for t in tenants}
        caps = {t: TIERS[tier] for t, tier in tenants.items()}
        body = {"model": "tiny-llama", "training_file": "ds-000000000000000000000000",
                "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1}}}}
        secret = internal_secret(tmp)

        # baseline: the same kind of load straight to the scheduler (signed identity, no gateway),
        # on half of the tenants; the gateway run gets the other half (quotas start empty for both)
        names = list(tenants)
        base_tenants, gw_tenants = names[: len(names) // 2], names[len(names) // 2:]
        print(f"baseline: {args.baseline_jobs} submissions straight to the scheduler ({len(base_tenants)} tenants)",
              flush=True)
        b_tally, b_elapsed = await load(sched, lambda t, method, path, payload: identity_headers(
                                            t, ("read", "write"), secret=secret, bound=Bound.of(method, path, payload)),
                                        plan(args.baseline_jobs, base_tenants, 1), args.concurrency, body)
        baseline = summary(b_tally, b_elapsed, caps)
        print("baseline " + json.dumps(baseline), flush=True)
        print(f"gateway: {args.jobs} submissions with API keys ({len(gw_tenants)} tenants)", flush=True)
        g_tally, g_elapsed = await load(gateway, lambda t, *_: {"Authorization": f"Bearer {keys[t]}"},
                                        plan(args.jobs, gw_tenants, 2), args.concurrency, body)
        result = summary(g_tally, g_elapsed, caps)
        if g_tally.wrong:
            print("wrong answers (first 5): " + "; ".join(g_tally.wrong[:5]), flush=True)
        # cross-check against the API's own listing: no tenant holds more jobs than its cap
        async with httpx.AsyncClient(base_url=gateway, timeout=60) as c:
            listed_over = 0
            for t in gw_tenants:
                r = await c.get("/v1/fine_tuning/jobs", params={"limit": 100},
                                headers={"Authorization": f"Bearer {keys[t]}"})
                listed_over += max(0, len(r.json()["data"]) - caps[t])
        result["over_admitted"] = max(result["over_admitted"], listed_over)
        result["baseline_direct"] = {k: baseline[k] for k in ("submissions_per_s", "create_p50_ms", "create_p99_ms",
                                                              "get_p99_ms", "errors_5xx")}
        result["targets"] = {"submissions_per_s>=200": result["submissions_per_s"] >= 200,
                             "create_p99_ms<=250": result["create_p99_ms"] <= 250}
        return result
    finally:
        stop_processes(edge, server)
        stack.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--baseline-jobs", type=int, default=2_000)
    p.add_argument("--tenants", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=16,
                   help="requests in flight; 16 saturate this 2-core server (more only wait in its queue)")
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
