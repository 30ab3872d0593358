"""A training file with images needs a base model that sees: a text-only base is refused at
admission with the reason (at once when the file's verdict is known, or when it arrives), a
vision-language base (a config with `vision_config` and an image processor) is admitted."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from whetstone.contracts import DatasetValidatedV1
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.scheduler.bootstrap import build_service
from whetstone.scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration


def vision_model(settings) -> str:
    """Sized like `whet models create-tiny --vision` (the scheduler reads config.json and file names only)."""
    d = Path(settings.model_catalog) / "tiny-llava"
    d.mkdir(parents=True, exist_ok=True)
    text = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "vocab_size": 1064, "num_attention_heads": 4, "max_position_embeddings": 1024}
    (d / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": text, "vision_config": {
        "model_type": "clip_vision_model", "image_size": 32, "patch_size": 8, "hidden_size": 32}}))
    (d / "processor_config.json").write_text(json.dumps({"processor_class": "LlavaProcessor"}))
    (d / "model.safetensors").write_bytes(b"weights-v1")
    return "tiny-llava"


async def dataset(settings, dataset_id: str, rows_with_images: int) -> None:
    await send_event(settings.kafka_bootstrap, DatasetValidatedV1(
        dataset_id=dataset_id, version="ab" * 32, name="d.jsonl", status="accepted", purpose="sft",
        data_schema="chat", rows_total=20, rows_kept=20, tokens_total=2000,
        stats={"images": rows_with_images, "rows_with_images": rows_with_images},
        train_uri=f"s3://whetstone/tenants/demo/datasets/{dataset_id}/train.jsonl"), "demo")


async def test_images_need_a_base_that_sees(platform, settings, tiny_model):
    llava = vision_model(settings)
    async with platform(lambda: build_service(SchedulerSettings())) as p:
        rt = p["scheduler"]
        api = openai.AsyncOpenAI(base_url=p.url("scheduler") + "/v1", api_key="unused",
                                 http_client=httpx.AsyncClient(auth=IdentityAuth("demo", ("read", "write")), timeout=60), max_retries=0)
        await dataset(settings, "file-img", 20)
        await dataset(settings, "file-txt", 0)
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 2 FROM datasets"), 30, "datasets")

        # the verdict is known: refused at once, the model named as the field to change
        with pytest.raises(openai.BadRequestError) as caught:
            await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-img")
        body = caught.value.body
        assert body["code"] == "model_cannot_see_images" and body["param"] == "model"
        assert "20 example(s) with images" in body["message"] and "tiny-llama" in body["message"]
        assert await rt.pool.fetchval("SELECT count(*) FROM jobs") == 0

        # a vision base takes the same file; a text file still trains on a text base
        seeing = await api.fine_tuning.jobs.create(model=llava, training_file="file-img")
        text = await api.fine_tuning.jobs.create(model=tiny_model, training_file="file-txt")

        async def both_queued():
            ids = {e["payload"]["job_id"] for e in await outbox(rt, "job.queued")}
            return {seeing.id, text.id} <= ids
        await wait_until(both_queued, 30, "both jobs queued")

        # the verdict arrives after the job: the job fails with the same reason
        waiting = await api.fine_tuning.jobs.create(model=tiny_model, training_file="ds-later")
        assert waiting.status == "validating_files"
        await dataset(settings, "ds-later", 3)

        async def failed():
            job = await api.fine_tuning.jobs.retrieve(waiting.id)
            return job if job.status == "failed" else None
        job = await wait_until(failed, 30, "the job fails")
        assert job.error.code == "model_cannot_see_images" and "3 example(s) with images" in job.error.message
