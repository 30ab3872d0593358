"""Serving on the real embedded stack: registry events in, OpenAI-compatible answers out, checked
with the official `openai` client against a PEFT reference computed here."""

import asyncio

import httpx
import openai
import pytest

from whetstone.devstack.serving_samples import promoted, registered, store_adapter
from whetstone.devstack.testing import send_event, wait_until
from whetstone.runtime.identity import IdentityAuth
from whetstone.runtime.models import weights_sha256
from whetstone.serving.bootstrap import build_service
from whetstone.serving.config import ServingSettings

pytestmark = pytest.mark.integration
BASE = "tiny-llama"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def reference_answer(base_dir, adapter_dir, messages, max_new_tokens=8) -> str:
    """Greedy answer of PEFT's own PeftModel.generate with the adapter: what serving must reproduce."""
    import torch
    from peft import PeftModel

    from whetstone.modelkit.loading import load_model, load_tokenizer

    tok = load_tokenizer(base_dir)
    model = PeftModel.from_pretrained(load_model(base_dir, dtype="float32"), str(adapter_dir)).eval()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def link_base(settings, tiny_base):
    settings.model_catalog.mkdir(parents=True, exist_ok=True)
    (settings.model_catalog / BASE).symlink_to(tiny_base, target_is_directory=True)
    return weights_sha256(tiny_base)


def client(p, tenant: str, scopes=("read",)) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=p.url("serving") + "/v1", api_key="unused", max_retries=0,
                              http_client=httpx.AsyncClient(auth=IdentityAuth(tenant, scopes), timeout=60))


async def test_openai_chat_completions_stream_ab_routes_and_tenancy(platform, settings, tiny_base, sample_adapters):
    sha = link_base(settings, tiny_base)
    b = settings.kafka_bootstrap
    from whetstone.runtime.s3 import ObjectStore

    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    name = "ft:tiny-llama:demo:support"
    v1 = store_adapter(store, sample_adapters[0], "demo", "wsm-v1", name)
    v2 = store_adapter(store, sample_adapters[1], "demo", "wsm-v2", name)
    other = store_adapter(store, sample_adapters[2], "demo", "wsm-other", "ft:tiny-llama:demo:other")
    theirs = store_adapter(store, sample_adapters[3], "acme", "wsm-acme", "ft:tiny-llama:acme:x")
    for a, tenant in ((v1, "demo"), (v2, "demo"), (other, "demo"), (theirs, "acme")):
        await send_event(b, registered(a, base_model=BASE, base_sha256=sha), tenant)
    config = ServingSettings(http_port=0, batch_window_ms=60, max_resident_adapters=8)
    async with platform(lambda: build_service(config)) as p:
        rt, demo = p["serving"], client(p, "demo")

        # registered in dev: known, not deployed
        async def status_of(model: str) -> int:
            try:
                await demo.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, temperature=0)
                return 200
            except openai.APIStatusError as exc:
                return exc.status_code
        await wait_until(lambda: _count(rt, 4), 30, "projection in memory")
        with pytest.raises(openai.NotFoundError) as err:
            await demo.chat.completions.create(model=name, messages=MESSAGES)
        assert err.value.code == "model_not_deployed"

        for a, seq in ((v1, 2), (other, 3)):
            await send_event(b, promoted(a, "dev", "staging", base_model=BASE, base_sha256=sha, sequence=seq), "demo")
        await wait_until(lambda: _is(status_of(name), 200), 30, "v1 served")
        await wait_until(lambda: _is(status_of(other.name), 200), 30, "other served")

        # same answers as PEFT's own generate, also when two adapters share one batch
        want_v1 = reference_answer(tiny_base, sample_adapters[0], MESSAGES)
        want_other = reference_answer(tiny_base, sample_adapters[2], MESSAGES)
        assert want_v1 != want_other
        passes_before, rows_before = rt.ctx.batcher.steps, rt.ctx.batcher.step_rows
        answers = await asyncio.gather(*(demo.chat.completions.with_raw_response.create(
            model=m, messages=MESSAGES, max_tokens=8, temperature=0) for m in (name, other.name, name, other.name)))
        # at least two requests shared a forward pass: more rows than passes
        assert rt.ctx.batcher.step_rows - rows_before > rt.ctx.batcher.steps - passes_before
        for raw, want, version in zip(answers, (want_v1, want_other) * 2, ("wsm-v1", "wsm-other") * 2):
            assert raw.headers["x-whetstone-model-version"] == version
            c = raw.parse()
            assert c.object == "chat.completion" and c.model in (name, other.name)
            assert c.choices[0].message.role == "assistant" and c.choices[0].finish_reason in ("stop", "length")
            assert c.choices[0].message.content == want
            assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens > 0

        # streaming: SSE chunks the official client parses, same text as without streaming
        stream = await demo.chat.completions.create(model=name, messages=MESSAGES, max_tokens=8, temperature=0,
                                                    stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_v1
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert chunks[-1].usage and chunks[-1].usage.completion_tokens > 0

        # an image part for a text-only base: a 400 naming the part, nothing decoded
        with pytest.raises(openai.BadRequestError) as err:
            await demo.chat.completions.create(model=name, max_tokens=2, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}])
        assert (err.value.code, err.value.body["param"]) == ("model_cannot_see_images", "messages[0].content[0]")

        # legacy completions, plain and streamed
        done = await demo.completions.create(model=name, prompt="The capital of France is", max_tokens=5,
                                             temperature=0)
        assert done.object == "text_completion" and done.usage.completion_tokens <= 5
        streamed = [c async for c in await demo.completions.create(
            model=name, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True)]
        assert "".join(c.choices[0].text for c in streamed if c.choices) == done.choices[0].text

        # another tenant's model does not exist for this caller; nor does an unknown one
        for model in (theirs.name, theirs.model_id, "ft:tiny-llama:demo:nope"):
            with pytest.raises(openai.NotFoundError) as err:
                await demo.chat.completions.create(model=model, messages=MESSAGES)
            assert err.value.code == "model_not_found"
        # prompt longer than the context
        with pytest.raises(openai.BadRequestError) as err:
            await demo.chat.completions.create(model=name, messages=[{"role": "user", "content": "apple " * 1100}])
        assert err.value.code == "context_length_exceeded"
        async with httpx.AsyncClient(base_url=p.url("serving")) as h:
            assert (await h.post("/v1/chat/completions", json={"model": name, "messages": MESSAGES})).status_code == 401

        # A/B: v2 joins in staging; the name splits 90/10 between v1 and v2, sticky per user
        await send_event(b, promoted(v2, "dev", "staging", base_model=BASE, base_sha256=sha, sequence=4), "demo")
        await wait_until(lambda: _resident(rt, "wsm-v2"), 30, "v2 preloaded on promotion")
        async with httpx.AsyncClient(base_url=p.url("serving")) as h:
            body = {"variants": [{"model": "wsm-v1", "weight": 90}, {"model": "wsm-v2", "weight": 10}]}
            denied = await h.put(f"/v1/serving/routes/{name}", json=body, auth=IdentityAuth("demo", ("read",)))
            assert denied.status_code == 403
            put = await h.put(f"/v1/serving/routes/{name}", json=body,
                              auth=IdentityAuth("demo", ("models:promote",)))
            assert put.status_code == 200, put.text
            before = {v["model"]: v["requests"] for v in put.json()["variants"]}
            bad = await h.put(f"/v1/serving/routes/{name}", json={"variants": [{"model": "wsm-acme", "weight": 1}]},
                              auth=IdentityAuth("demo", ("models:promote",)))
            assert bad.status_code == 404 and bad.json()["error"]["param"] == "variants.0.model"
        seen: dict[str, str] = {}
        for i in range(40):
            raw = await demo.chat.completions.with_raw_response.create(
                model=name, messages=MESSAGES, max_tokens=1, temperature=0, user=f"user-{i % 20}")
            version = raw.headers["x-whetstone-model-version"]
            assert seen.setdefault(f"user-{i % 20}", version) == version  # sticky
        assert set(seen.values()) <= {"wsm-v1", "wsm-v2"}
        assert sum(v == "wsm-v1" for v in seen.values()) >= 12  # ~90% of 20 users
        async with httpx.AsyncClient(base_url=p.url("serving")) as h:
            view = (await h.get(f"/v1/serving/routes/{name}", auth=IdentityAuth("demo", ("read",)))).json()
            counts = {v["model"]: v["requests"] - before[v["model"]] for v in view["variants"]}
            assert sum(counts.values()) == 40  # every request counted once, on the version that served it
            assert counts["wsm-v1"] == 2 * sum(v == "wsm-v1" for v in seen.values())
            metrics = (await h.get("/metrics")).text
            assert 'whetstone_serving_requests_total{model="ft:tiny-llama:demo:support"' in metrics
            assert 'version="wsm-v2"' in metrics

        # archive v1: unloaded, the route sends everyone to v2; asking v1 by id is refused
        await send_event(b, promoted(v1, "staging", "archived", base_model=BASE, base_sha256=sha, sequence=5), "demo")
        await wait_until(lambda: _not_resident(rt, "wsm-v1"), 30, "v1 unloaded on archive")
        raw = await demo.chat.completions.with_raw_response.create(model=name, messages=MESSAGES, max_tokens=1,
                                                                   user="user-0")
        assert raw.headers["x-whetstone-model-version"] == "wsm-v2"
        with pytest.raises(openai.NotFoundError) as err:
            await demo.chat.completions.create(model="wsm-v1", messages=MESSAGES)
        assert err.value.code == "model_not_deployed"
        # a stale (older) stage change is ignored
        stale = await send_event(b, promoted(v1, "dev", "staging", base_model=BASE, base_sha256=sha, sequence=1), "demo")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) = 1 FROM inbox WHERE message_id = $1",
                                                  str(stale.event_id)), 30, "the stale stage change handled")
        assert await rt.pool.fetchval("SELECT stage FROM model_versions WHERE model_id = 'wsm-v1'") == "archived"


async def _count(rt, n: int, stage: str | None = None) -> bool:
    return sum(stage in (None, v.stage) for v in rt.ctx.catalog.versions.values()) == n


async def _is(value, expected) -> bool:
    return (await value) == expected


async def _resident(rt, model_id: str) -> bool:
    return rt.ctx.pool.resident(model_id)


async def _not_resident(rt, model_id: str) -> bool:
    return rt.ctx.catalog.versions[model_id].stage == "archived" and not rt.ctx.pool.resident(model_id)
