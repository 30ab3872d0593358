"""Console benchmark: the web console in headless Debian Chromium over the embedded stack, with 1,000
jobs in the tenant.

Setup (not timed): the embedded Kafka/Postgres/S3, the scheduler and ingest in this process, the
gateway in front. One training file is uploaded and validated and one job created through the public
API (POST /v1/fine_tuning/jobs). The other 999 are that job's history: copies of the scheduler's own
Job aggregate (new ids, suffixes and creation times; succeeded or cancelled) written through its
JobStore in one transaction, the fastest honest way to a tenant with 1,000 jobs (`--via api` creates
them all through the API instead: minutes on a loaded 2-core machine, the tenant's in-flight quota
raised). No trainer runs: a node played by this script takes the queued job: it sends the node's
heartbeats, reads the scheduler's `job.assigned` off the bus and answers `job.started`, as a
trainer-agent would. That job's page is the "job page".

Figures:
- jobs_page_interactive_ms / job_page_interactive_ms: navigation start to the moment the page's data
  is on screen (the console marks its view `data-ready` after the page's API answers rendered), from
  a fresh browser context (empty cache, signed in); the median of --loads loads. First contentful
  paint and largest contentful paint from Chromium's performance timeline are printed beside it.
- page_kib_max: bytes over the wire (the performance timeline's transferSize of the document and
  every resource it loaded, API answers included) of the heavier of the two pages.
- bus_to_chart_ms_p95: a `job.progress` published to the broker (timed just before the send) until the
  point is drawn on the open job page's loss chart (the chart's data-points attribute changing,
  observed in the page with a MutationObserver; one clock, the machine's). --points reports, one at a
  time; p50/p95/max.
- the machine's 1-minute load average and CPU count at the end: on a shared 2-core machine the other
  processes' load shows in every browser figure (first paint included), so read them together.

    .venv/bin/python bench/console.py [--jobs 1000] [--loads 5] [--points 40] [--via store|api]

Last line: JSON with the figures and whether each meets its target (pages <= 1000 ms,
page_kib_max <= 300, bus_to_chart_ms_p95 <= 1000)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

CHROMIUM = Path(os.environ.get("WHETSTONE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TARGET_PAGE_MS, TARGET_KIB, TARGET_BUS_MS = 1000.0, 300.0, 1000.0
TENANT, NODE = "demo", "bench-console-node"
DATASET = Path(__file__).resolve().parents[1] / "examples" / "datasets" / "chat_demo.jsonl"
# Runs in the page before the console's scripts: the moment its view is marked ready, and every change
# of the loss chart's point count with the wall-clock time it happened.
TIMING_SCRIPT = """
window.__ready = null; window.__points = []; window.__lcp = null;
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__lcp = e.startTime; })
  .observe({ type: 'largest-contentful-paint', buffered: true });
new MutationObserver((changes, obs) => {
  for (const c of changes) {
    const el = c.target;
    if (window.__ready === null && el.classList && el.classList.contains('view') && el.hasAttribute('data-ready'))
      window.__ready = performance.now();
    if (el.tagName === 'svg' && c.attributeName === 'data-points')
      window.__points.push([+el.getAttribute('data-points'), Date.now()]);
  }
}).observe(document, { subtree: true, attributes: true, attributeFilter: ['data-ready', 'data-points'] });
"""
PAGE_FIGURES = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const paints = Object.fromEntries(performance.getEntriesByType('paint').map((p) => [p.name, p.startTime]));
  const bytes = [nav, ...performance.getEntriesByType('resource')]
    .reduce((n, e) => n + (e.transferSize || e.encodedBodySize || 0), 0);
  return { ready_ms: window.__ready, fcp_ms: paints['first-contentful-paint'] ?? null,
           lcp_ms: window.__lcp, bytes, resources: performance.getEntriesByType('resource').length };
}"""


def log(message: str) -> None:
    print(f"[bench-console] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


async def until(check, timeout_s: float, what: str, every: float = 0.3):
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(every)


async def create_jobs(c: httpx.AsyncClient, file_id: str, n: int, concurrency: int = 8) -> list[str]:
    todo = iter(range(n))
    ids: list[str] = []

    async def worker() -> None:
        for i in todo:
            r = await c.post("/v1/fine_tuning/jobs", json={"model": "tiny-llama", "training_file": file_id,
                                                           "suffix": f"bench-{i:04d}"})
            r.raise_for_status()
            ids.append(r.json()["id"])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ids


async def copy_jobs(scheduler, template_id: str, n: int) -> None:
    """`n` finished jobs of the tenant, copied from the template job's aggregate through the JobStore."""
    import dataclasses
    from datetime import timedelta

    from whetstone.contracts import job_id_for
    from whetstone.contracts.enums import JobStatus
    from whetstone.scheduler.adapters.store import JobStore

    async with scheduler.uow() as uow:
        store = JobStore(uow)
        template = await store.get(template_id)
        assert template is not None
        now = datetime.now(UTC)
        for i in range(n):
            created = now - timedelta(hours=n - i)
            done = JobStatus.CANCELLED if i % 5 == 4 else JobStatus.SUCCEEDED
            await store.add(dataclasses.replace(
                template, job_id=job_id_for(TENANT, f"bench-history-{i}"), idempotency_key=f"bench-history-{i}",
                request=template.request.model_copy(update={"suffix": f"history-{i:04d}"}), status=done,
                created_at=created, updated_at=created + timedelta(minutes=20), queued_at=created,
                queued_since=None, started_at=created + timedelta(minutes=1),
                finished_at=created + timedelta(minutes=20), sort_key=None, notes=[]))


class Node:
    """The trainer side of one node, played on the bus: heartbeats, then `job.started` for its assignment."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.running: list[str] = []

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        self.producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=0)
        await self.producer.start()
        self.beats = asyncio.create_task(self.beat_forever())

    async def publish(self, event, key: str) -> None:
        from whetstone.contracts import TOPICS
        from whetstone.runtime.messaging import encode, make_envelope

        env = make_envelope(event, producer="trainer-agent", tenant_id=TENANT if hasattr(event, "job_id") else "platform")
        await self.producer.send_and_wait(TOPICS[event.EVENT_TYPE].name, encode(env), key=key.encode())

    async def beat_forever(self) -> None:
        from whetstone.contracts import NodeHeartbeatV1

        while True:
            await self.publish(NodeHeartbeatV1(node_id=NODE, gpu_type="cpu", gpu_count=1,
                                               free_gpu_ids=[] if self.running else [0], running_jobs=self.running,
                                               sent_at=datetime.now(UTC)), NODE)
            await asyncio.sleep(2.0)

    async def take_assignment(self, timeout_s: float = 120) -> tuple[str, str, int]:
        """The first job.assigned for this node; answered with job.started. (job_id, segment_id, attempt)"""
        from aiokafka import AIOKafkaConsumer
        from whetstone.contracts import JobAssignedV1, JobStartedV1
        from whetstone.runtime.messaging import decode, parse_payload

        consumer = AIOKafkaConsumer("job.assigned", bootstrap_servers=self.bootstrap, group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=50)
        await consumer.start()
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for rec in records:
                        ev = parse_payload(decode(rec.value), JobAssignedV1)
                        if ev.node_id == NODE:
                            self.running = [ev.job_id]
                            await self.publish(JobStartedV1(job_id=ev.job_id, node_id=NODE, segment_id=ev.segment_id,
                                                            attempt=ev.attempt, gpu_type="cpu", gpu_count=1,
                                                            started_at=datetime.now(UTC), total_steps=10_000),
                                               ev.job_id)
                            return ev.job_id, ev.segment_id, ev.attempt
        finally:
            await consumer.stop()
        raise TimeoutError("no job.assigned for the bench node")

    async def stop(self) -> None:
        self.beats.cancel()
        await self.producer.stop()


async def open_page(browser, base: str, key: str, hash_: str):
    """A fresh browser context signed in (the session cookie set first) and the console page `hash_`
    opened in it with the timing script, once the page says it is ready. Answers (context, page)."""
    context = await browser.new_context(base_url=base, viewport={"width": 1280, "height": 900})
    r = await context.request.post("/console/session", data={"api_key": key})
    assert r.ok, await r.text()
    page = await context.new_page()
    await page.add_init_script(TIMING_SCRIPT)
    await page.goto(f"{base}/{hash_}")
    await page.wait_for_function("() => window.__ready !== null", timeout=30_000)
    return context, page


async def load_page(browser, base: str, key: str, hash_: str) -> dict:
    """One cold load of a console page in a fresh context, signed in."""
    context, page = await open_page(browser, base, key, hash_)
    try:
        await asyncio.sleep(0.3)   # let late resources land in the timeline
        return await page.evaluate(PAGE_FIGURES)
    finally:
        await context.close()


async def bus_to_chart(browser, base: str, key: str, node: Node, job: tuple[str, str, int], points: int) -> list[float]:
    from whetstone.contracts import JobProgressV1

    job_id, segment_id, attempt = job
    context, page = await open_page(browser, base, key, f"#/jobs/{job_id}")
    try:
        await asyncio.sleep(1.0)   # the event stream open
        delays = []
        for step in range(1, points + 1):
            before = await page.evaluate("() => window.__points.length")
            sent = time.time() * 1000
            await node.publish(JobProgressV1(job_id=job_id, segment_id=segment_id, attempt=attempt, step=step,
                                             total_steps=10_000, loss=2.0 / step ** 0.5), job_id)
            await page.wait_for_function(f"(n) => window.__points.slice({before}).some(([p]) => p >= n)", arg=step,
                                         timeout=30_000)
            seen = await page.evaluate(f"(n) => window.__points.slice({before}).find(([p]) => p >= n)[1]", step)
            delays.append(seen - sent)
            await asyncio.sleep(0.1)
        return delays
    finally:
        await context.close()


async def run(args: argparse.Namespace) -> dict:
    from playwright.async_api import async_playwright

    from whetstone.cli.dev import build_services, upstreams_of
    from whetstone.cli.keys import create_key
    from whetstone.contracts import all_topic_partitions
    from whetstone.devstack.stack import EmbeddedStack
    from whetstone.gateway.config import GatewaySettings
    from whetstone.gateway.server import start_gateway
    from whetstone.ingest.bootstrap import build_service as ingest_svc
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.service import run_services
    from whetstone.runtime.settings import CommonSettings
    from whetstone.scheduler.bootstrap import build_service as scheduler_svc

    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} missing: `sh deploy/tools/ensure-chromium.sh` installs it")
    root = Path(tempfile.mkdtemp(prefix="bench-console-"))
    stack = EmbeddedStack(root / "stack", topics=all_topic_partitions(), buckets=["whetstone"], log=lambda m: None)
    endpoints = await asyncio.to_thread(stack.start)
    os.environ.update({**endpoints.as_env(), "WHETSTONE_DATA_DIR": str(root), "HF_HUB_OFFLINE": "1",
                       "WHETSTONE_LOG_LEVEL": "WARNING", "WHETSTONE_SCHEDULER_HTTP_PORT": "0",
                       "WHETSTONE_INGEST_HTTP_PORT": "0",
                       "WHETSTONE_SCHEDULER_TENANT_QUOTAS": json.dumps({TENANT: {"max_in_flight": args.jobs + 100}})})
    settings = CommonSettings(log_json=True)
    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    stop = asyncio.Event()
    started: asyncio.Future = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_services(build_services([scheduler_svc, ingest_svc], []), settings,
                                            started.set_result, stop, handle_signals=False))
    node = None
    try:
        await asyncio.wait((task, started), return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()
        upstreams = upstreams_of(started.result())
        gateway = await start_gateway(GatewaySettings(rate_limit_per_s=10_000, tenant_rate_limit_per_s=10_000),
                                      upstreams, port=0)
        try:
            key = (await asyncio.to_thread(create_key, TENANT, name="bench", scopes=["read", "write"],
                                           base_url=upstreams["scheduler"]))["key"]
            async with httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"},
                                         timeout=60) as c:
                rows = b"".join(DATASET.read_bytes().splitlines(keepends=True)[:48])
                f = (await c.post("/v1/files", files={"file": ("bench.jsonl", rows)},
                                  data={"purpose": "fine-tune"})).json()
                await until(lambda: _processed(c, f["id"]), 120, "the training file validated")
                began = time.monotonic()
                if args.via == "api":
                    ids = await create_jobs(c, f["id"], args.jobs)
                else:
                    ids = await create_jobs(c, f["id"], 1)
                    scheduler = next(rt for rt in started.result() if rt.name == "scheduler")
                    await copy_jobs(scheduler, ids[0], args.jobs - 1)
                log(f"{args.jobs} jobs in the tenant ({args.via}) in {time.monotonic() - began:.1f} s")
                node = Node(endpoints.kafka_bootstrap)
                await node.start()
                job = await node.take_assignment()
                await until(lambda: _running(c, job[0]), 60, "the bench node's job running")
                api_ms = []
                for _ in range(5):
                    t = time.perf_counter()
                    listed = (await c.get("/v1/fine_tuning/jobs", params={"limit": 50})).json()
                    api_ms.append((time.perf_counter() - t) * 1000)
                log(f"job page: {job[0]} (running); GET /v1/fine_tuning/jobs?limit=50 ms={[round(x) for x in api_ms]} "
                    f"has_more={listed['has_more']}")
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                try:
                    await load_page(browser, gateway.url, key, "#/jobs")   # warm the server side once
                    pages = {}
                    for name, where in (("jobs", "#/jobs"), ("job", f"#/jobs/{job[0]}")):
                        loads = [await load_page(browser, gateway.url, key, where) for _ in range(args.loads)]
                        pages[name] = loads
                        log(f"{name} page: ready_ms={[round(x['ready_ms']) for x in loads]} "
                            f"fcp_ms={[round(x['fcp_ms'] or 0) for x in loads]} "
                            f"lcp_ms={[round(x['lcp_ms'] or 0) for x in loads]} "
                            f"KiB={[round(x['bytes'] / 1024, 1) for x in loads]}")
                    delays = await bus_to_chart(browser, gateway.url, key, node, job, args.points)
                    log(f"bus->chart ms: p50={pct(delays, 50):.0f} p95={pct(delays, 95):.0f} max={max(delays):.0f}")
                finally:
                    await browser.close()
        finally:
            await gateway.stop()
    finally:
        if node is not None:
            await node.stop()
        stop.set()
        await task
        await asyncio.to_thread(stack.stop, discard=True)

    def median(name: str, field: str) -> float:
        return round(statistics.median(x[field] or 0 for x in pages[name]), 1)

    result = {
        "jobs": args.jobs, "via": args.via, "jobs_api_ms_median": round(statistics.median(api_ms), 1),
        # the machine's other work slows the browser as much as anything the console does: said beside the figures
        "load_average_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "jobs_page_interactive_ms": median("jobs", "ready_ms"),
        "job_page_interactive_ms": median("job", "ready_ms"),
        "jobs_page_fcp_ms": median("jobs", "fcp_ms"), "job_page_fcp_ms": median("job", "fcp_ms"),
        "jobs_page_lcp_ms": median("jobs", "lcp_ms"), "job_page_lcp_ms": median("job", "lcp_ms"),
        "page_kib_max": round(max(x["bytes"] for loads in pages.values() for x in loads) / 1024, 1),
        "bus_to_chart_ms_p50": round(pct(delays, 50), 1),
        "bus_to_chart_ms_p95": round(pct(delays, 95), 1),
        "bus_to_chart_ms_max": round(max(delays), 1),
    }
    result["targets_met"] = {
        "jobs_page_interactive_ms": result["jobs_page_interactive_ms"] <= TARGET_PAGE_MS,
        "job_page_interactive_ms": result["job_page_interactive_ms"] <= TARGET_PAGE_MS,
        "page_kib_max": result["page_kib_max"] <= TARGET_KIB,
        "bus_to_chart_ms_p95": result["bus_to_chart_ms_p95"] <= TARGET_BUS_MS,
    }
    return result


async def _processed(c: httpx.AsyncClient, file_id: str) -> bool:
    status = (await c.get(f"/v1/files/{file_id}")).json().get("status")
    if status == "error":
        raise RuntimeError(f"the training file was refused: {file_id}")
    return status == "processed"


async def _running(c: httpx.AsyncClient, job_id: str) -> bool:
    return (await c.get(f"/v1/fine_tuning/jobs/{job_id}")).json().get("status") == "running"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--loads", type=int, default=5, help="cold loads of each page (the median is reported)")
    ap.add_argument("--points", type=int, default=40, help="job.progress reports timed to the chart")
    ap.add_argument("--via", choices=("store", "api"), default="store", help="how the jobs get into the tenant")
    result = asyncio.run(run(ap.parse_args()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
