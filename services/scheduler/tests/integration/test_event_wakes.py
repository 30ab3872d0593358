"""A job's live event stream is woken by Postgres NOTIFY when the job's events change, not by
each stream polling: a cancel reaches an open stream, [DONE] included, well
before the streams' own fallback look (5 s)."""

import asyncio
import time

import httpx
import openai
import pytest
from whetstone.contracts import DatasetValidatedV1
from whetstone.devstack.testing import send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.scheduler.entrypoints.api import STREAM_FALLBACK_S
from whetstone.scheduler.bootstrap import build_service

pytestmark = pytest.mark.integration


async def test_a_cancel_wakes_the_open_stream_at_once(platform, settings, tiny_model):
    async with platform(build_service) as p:
        rt = p["scheduler"]
        await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
            dataset_id="file-sft", version="cd" * 32, name="d.jsonl", status="accepted", purpose="sft",
            rows_total=20, rows_kept=20, tokens_total=4000,
            train_uri="s3://whetstone/tenants/demo/datasets/file-sft/train.jsonl"), "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM datasets"), 30, "dataset")
        api = openai.AsyncOpenAI(base_url=p.url("scheduler") + "/v1", api_key="unused", max_retries=0,
                                 http_client=httpx.AsyncClient(auth=IdentityAuth("demo", ("read", "write")), timeout=60))
        job = await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-sft")
        async with httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as c, c.stream(
                "GET", f"/v1/fine_tuning/jobs/{job.id}/events", params={"stream": "true"},
                auth=IdentityAuth("demo")) as r:
            lines = r.aiter_lines()
            while not (await anext(lines)).startswith("data: "):   # the stream's first look is done
                pass
            await asyncio.sleep(0.3)
            cancelled_at = time.perf_counter()
            await api.fine_tuning.jobs.cancel(job.id)
            rest = []
            async for line in lines:
                if line.startswith("data: "):
                    rest.append(line)
            took = time.perf_counter() - cancelled_at
        assert rest[-1] == "data: [DONE]" and any("cancel" in x for x in rest), rest
        assert took < STREAM_FALLBACK_S / 2, took
