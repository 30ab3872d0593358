"""While PostgreSQL restarts under a stream of job submissions, the scheduler's API answers 200, 429 (a
quota) or 503 `service_unavailable` with Retry-After, never a 500; every submission that was answered
200 is a job once the database is back, and none is there twice. The chaos suite once caught a 500
here: a pooled connection that had read the server's FATAL goodbye but not yet its close."""

from __future__ import annotations

import asyncio
import collections

import httpx
import pytest

from whetstone.devstack.stack import EmbeddedStack
from whetstone.devstack.testing import all_topic_partitions

from .test_scheduler_service import node_and_dataset, post, scheduler

pytestmark = pytest.mark.integration
RESTARTS = 4


@pytest.fixture
def embedded(tmp_path):
    s = EmbeddedStack(tmp_path / "stack", topics=all_topic_partitions(), buckets=["whetstone"], log=lambda m: None,
                      durable_postgres=True)   # a killed server keeps every committed row
    s.start()
    try:
        yield s
    finally:
        s.stop(discard=True)


@pytest.fixture
def stack(embedded):   # the settings and platform fixtures run on this stack, which the test can restart
    return embedded.endpoints


async def test_submissions_during_postgres_restarts_get_503_with_retry_after_never_a_500(
        embedded, platform, settings, tiny_model):
    answers: collections.Counter = collections.Counter()
    wrong: list[str] = []
    accepted: set[str] = set()
    async with platform(scheduler()) as p:
        rt = p["scheduler"]
        await node_and_dataset(settings, rt)
        halt = asyncio.Event()

        async def submitter(i: int) -> None:
            n = 0
            async with httpx.AsyncClient(base_url=p.url("scheduler"), timeout=15) as c:
                while not halt.is_set():
                    n += 1
                    key = f"k{i}-{n // 3}"    # each key sent three times: retries of one submission
                    try:
                        r = await post(c, ("demo", "acme")[i % 2], key)
                    except httpx.TransportError as exc:
                        wrong.append(f"{key}: {type(exc).__name__}")
                        continue
                    answers[r.status_code] += 1
                    if r.status_code == 200:
                        accepted.add(r.json()["id"])
                    elif r.status_code == 503:
                        if r.json()["error"]["code"] != "service_unavailable" or not r.headers.get("retry-after"):
                            wrong.append(f"{key}: 503 {r.headers.get('retry-after')} {r.text[:200]}")
                    elif r.status_code != 429:
                        wrong.append(f"{key}: {r.status_code} {r.text[:300]}")
                    await asyncio.sleep(0.02)

        clients = [asyncio.create_task(submitter(i)) for i in range(6)]
        for i in range(RESTARTS):
            await asyncio.sleep(2.0)
            await asyncio.to_thread(embedded.stop_component, "postgres", kill=i % 2 == 1)
            await asyncio.sleep(1.0 + i % 2)
            await asyncio.to_thread(embedded.start_component, "postgres")
        await asyncio.sleep(3.0)
        halt.set()
        await asyncio.gather(*clients)
        assert not wrong, wrong[:5]
        assert answers[503] > 0 and answers[200] > 0, answers    # the restarts were seen, and so was the service
        stored = await rt.pool.fetch("SELECT job_id FROM jobs")
        ids = [r["job_id"] for r in stored]
        assert len(ids) == len(set(ids)) and accepted <= set(ids), (len(accepted), len(ids))
