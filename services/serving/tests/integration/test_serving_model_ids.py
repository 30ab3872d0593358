"""OpenAI's model ids in serving, on the real embedded stack with the
official `openai` client: a version answers to its public id (`fine_tuned_model`), a checkpoint of its
job to `<fine_tuned_model>:ckpt-step-<N>` (its own weights, once the job's model is live), and the served
base model to its catalog name (the base alone, no adapter)."""

import asyncio
from datetime import UTC, datetime

import httpx
import openai
import pytest

from whetstone.contracts import CheckpointWrittenV1, checkpoint_model_for
from whetstone.devstack.serving_samples import promoted, registered, store_adapter
from whetstone.devstack.testing import send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.runtime.models import weights_sha256
from whetstone.runtime.s3 import ObjectStore
from whetstone.serving.bootstrap import build_service
from whetstone.serving.config import ServingSettings

pytestmark = pytest.mark.integration
BASE = "tiny-llama"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def greedy(base_dir, adapter_dir, messages, max_new_tokens=8) -> str:
    """Greedy answer of transformers' own generate: the base alone (adapter_dir None) or with PEFT's adapter."""
    import torch
    from peft import PeftModel

    from whetstone.modelkit.loading import load_model, load_tokenizer

    tok = load_tokenizer(base_dir)
    model = load_model(base_dir, dtype="float32")
    model = (PeftModel.from_pretrained(model, str(adapter_dir)) if adapter_dir else model).eval()
    ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def checkpoint_event(job_id: str, step: int, a) -> CheckpointWrittenV1:
    return CheckpointWrittenV1(job_id=job_id, segment_id=f"{job_id}:1", attempt=1, checkpoint_id=f"ckpt-{step}",
                               kind="periodic", step=step, uri=a.uri, manifest_sha256=a.manifest_sha256,
                               files=len(a.files), size_bytes=1, written_at=datetime.now(UTC))


async def test_public_ids_checkpoints_and_the_base_model(platform, settings, tiny_base, sample_adapters):
    settings.model_catalog.mkdir(parents=True, exist_ok=True)
    (settings.model_catalog / BASE).symlink_to(tiny_base, target_is_directory=True)
    sha = weights_sha256(tiny_base)
    b = settings.kafka_bootstrap
    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    name = "ft:tiny-llama:demo:ids"
    public = f"{name}:0123456789ab"
    final = store_adapter(store, sample_adapters[0], "demo", "wsm-ids", name)
    step4 = store_adapter(store, sample_adapters[1], "demo", "wsm-ids-step4", name)  # the job's step-4 checkpoint
    held = store_adapter(store, sample_adapters[2], "demo", "wsm-held", "ft:tiny-llama:demo:held")
    job = "job-wsm-ids"   # samples.registered's lineage job id
    await send_event(b, registered(final, base_model=BASE, base_sha256=sha, fine_tuned_model=public), "demo")
    await send_event(b, checkpoint_event(job, 4, step4), "demo")
    held_public = "ft:tiny-llama:demo:held:ba9876543210"
    await send_event(b, registered(held, base_model=BASE, base_sha256=sha, fine_tuned_model=held_public), "demo")
    await send_event(b, checkpoint_event("job-wsm-held", 2, step4), "demo")
    config = ServingSettings(http_port=0, batch_window_ms=20, max_resident_adapters=4)
    async with platform(lambda: build_service(config)) as p:
        rt = p["serving"]
        demo, acme = (openai.AsyncOpenAI(base_url=p.url("serving") + "/v1", api_key="unused", max_retries=0,
                                         http_client=httpx.AsyncClient(auth=IdentityAuth(t, ("read",)), timeout=60)) for t in ("demo", "acme"))

        async def answer(client, model: str) -> str:
            c = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0)
            assert c.model == model
            return c.choices[0].message.content

        async def code_of(client, model: str) -> str | None:
            try:
                await answer(client, model)
                return None
            except openai.APIStatusError as exc:
                return exc.code

        # the base, by its catalog name, for every tenant: the base's own answer (no adapter)
        want_base = await asyncio.to_thread(greedy, tiny_base, None, MESSAGES)
        assert await answer(demo, BASE) == want_base
        assert await answer(acme, BASE) == want_base

        async def projected() -> bool:
            return len(rt.ctx.catalog.versions) >= 2
        await wait_until(projected, 30, "projection in memory")
        ckpt = checkpoint_model_for(public, 4)
        # in dev neither the version nor its checkpoints are served
        assert await code_of(demo, public) == "model_not_deployed"
        assert await code_of(demo, ckpt) == "model_not_deployed"
        await send_event(b, promoted(final, "dev", "staging", base_model=BASE, base_sha256=sha, sequence=2), "demo")

        async def live() -> bool:
            return await code_of(demo, public) is None
        await wait_until(live, 30, "the version served by its public id")
        want_final, want_step4 = await asyncio.gather(
            asyncio.to_thread(greedy, tiny_base, sample_adapters[0], MESSAGES),
            asyncio.to_thread(greedy, tiny_base, sample_adapters[1], MESSAGES))
        assert len({want_base, want_final, want_step4}) == 3
        assert await answer(demo, public) == want_final
        assert await answer(demo, name) == want_final            # the name's live version, as before
        assert await answer(demo, "wsm-ids") == want_final       # the internal id still works
        assert await answer(demo, ckpt) == want_step4            # the checkpoint's own weights
        # a step the job never wrote, another tenant, a model still in dev: refused, named
        assert await code_of(demo, checkpoint_model_for(public, 5)) == "model_not_found"
        assert await code_of(acme, ckpt) == "model_not_found"
        assert await code_of(acme, public) == "model_not_found"
        assert await code_of(demo, checkpoint_model_for(held_public, 2)) == "model_not_deployed"
        # archiving the version stops its checkpoints too
        await send_event(b, promoted(final, "staging", "archived", base_model=BASE, base_sha256=sha, sequence=3),
                         "demo")

        async def archived() -> bool:
            return await code_of(demo, ckpt) == "model_not_deployed"
        await wait_until(archived, 30, "checkpoint refused once the version is archived")
