"""What serving refuses, on the real embedded stack: corrupted adapter objects, adapters trained on
another base SHA, archived models, events naming another tenant's weights (dead-lettered with
tenant_mismatch), requests past the per-tenant caps; and the LRU budget with cold loads on demand."""

import asyncio
import dataclasses
import shutil
from datetime import UTC, datetime

import httpx
import openai
import pytest

from whetstone.contracts import CheckpointWrittenV1
from whetstone.devstack.serving_samples import promoted, registered, store_adapter
from whetstone.devstack.testing import send_event, wait_until
from whetstone.modelkit.tiny import CHAT_TEMPLATE
from whetstone.runtime.identity import IdentityAuth
from whetstone.runtime.models import weights_sha256
from whetstone.runtime.s3 import ObjectStore
from whetstone.serving.bootstrap import build_service
from whetstone.serving.config import ServingSettings

pytestmark = pytest.mark.integration
BASE = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Hello"}]


async def test_refusals_and_lru_budget(platform, settings, tiny_base, sample_adapters, tmp_path):
    settings.model_catalog.mkdir(parents=True, exist_ok=True)
    (settings.model_catalog / BASE).symlink_to(tiny_base, target_is_directory=True)
    sha = weights_sha256(tiny_base)
    b = settings.kafka_bootstrap
    store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, settings.bucket)
    good = [store_adapter(store, sample_adapters[i], "demo", f"wsm-g{i}", f"ft:tiny-llama:demo:g{i}") for i in range(3)]
    corrupt = store_adapter(store, sample_adapters[3], "demo", "wsm-bad", "ft:tiny-llama:demo:bad")
    # the weights object is replaced after the manifest was written: its sha256 no longer matches
    key = corrupt.uri.removeprefix(f"s3://{settings.bucket}/") + "/adapter_model.safetensors"
    store.put_bytes(key, b"not the weights that were trained")
    drifted = store_adapter(store, sample_adapters[0], "demo", "wsm-drift", "ft:tiny-llama:demo:drift")
    # trained with its own chat template (a system preamble the base template lacks)
    own = tmp_path / "own-template"
    shutil.copytree(sample_adapters[1], own)
    own_template = "{{- '<|system|>\nAnswer briefly.<|end|>\n' -}}" + CHAT_TEMPLATE
    (own / "chat_template.jinja").write_text(own_template)
    templated = store_adapter(store, own, "demo", "wsm-tmpl", "ft:tiny-llama:demo:tmpl")
    # the registry recorded another template than the one in the artifact
    mismatched = dataclasses.replace(
        store_adapter(store, sample_adapters[1], "demo", "wsm-mis", "ft:tiny-llama:demo:mis"),
        chat_template_sha256="0" * 64)
    for a, base_sha in [*((g, sha) for g in good), (corrupt, sha), (drifted, "f" * 64), (templated, sha),
                        (mismatched, sha)]:
        await send_event(b, registered(a, base_model=BASE, base_sha256=base_sha), "demo")
        await send_event(b, promoted(a, "dev", "staging", base_model=BASE, base_sha256=base_sha, sequence=1), "demo")
    config = ServingSettings(http_port=0, max_resident_adapters=2, preload=False, max_prompt_chars=2000,
                             max_queued_per_tenant=1, max_messages=3, max_prompt_tokens=48)
    async with platform(lambda: build_service(config)) as p:
        rt = p["serving"]
        demo = openai.AsyncOpenAI(base_url=p.url("serving") + "/v1", api_key="unused", max_retries=0,
                                  http_client=httpx.AsyncClient(auth=IdentityAuth("demo", ("read",)), timeout=60))
        await wait_until(lambda: _staging(rt, 7), 30, "projection in memory")

        async def refusal(model: str) -> openai.APIStatusError:
            with pytest.raises(openai.APIStatusError) as err:
                await demo.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2)
            return err.value

        err = await refusal(corrupt.name)
        assert (err.status_code, err.code) == (422, "adapter_corrupted") and "sha256" in err.message
        assert not rt.ctx.pool.resident("wsm-bad")
        err = await refusal(drifted.name)
        assert (err.status_code, err.code) == (422, "base_model_mismatch")
        assert not rt.ctx.pool.resident("wsm-drift")

        # three adapters, two slots: each still answers, cold-loading and evicting the least recently used
        for a in (*good, good[0]):
            reply = await demo.chat.completions.create(model=a.name, messages=MESSAGES, max_tokens=2, temperature=0)
            assert reply.choices[0].finish_reason in ("stop", "length")
            assert len(rt.ctx.pool.lru) <= 2 and len(rt.ctx.engine.adapters) <= 2
        assert len(rt.ctx.pool.cold_load_ms) == 4  # g0, g1, g2 (evicts g0), g0 again (evicts g1)
        assert rt.ctx.pool.resident("wsm-g0") and rt.ctx.pool.resident("wsm-g2")
        assert len(rt.ctx.engine.adapters) == 2  # the evicted one left the engine's slots too

        # fair sharing: a prompt over the cap is refused before it is tokenised; a tenant with its one
        # pending request gets 429s for the rest of its burst while another tenant is still served
        with pytest.raises(openai.BadRequestError) as too_long:
            await demo.chat.completions.create(model=good[0].name, max_tokens=2,
                                               messages=[{"role": "user", "content": "x" * 1500}] * 2)
        assert (too_long.value.code, too_long.value.param) == ("prompt_too_long", "messages")
        # more messages than the cap: refused before rendering, naming `messages`
        with pytest.raises(openai.BadRequestError) as too_many:
            await demo.chat.completions.create(model=good[0].name, max_tokens=2, messages=MESSAGES * 4)
        assert (too_many.value.code, too_many.value.param) == ("too_many_messages", "messages")
        # under the character cap but over the token cap once rendered: refused, nothing generated
        with pytest.raises(openai.BadRequestError) as too_many_tokens:
            await demo.chat.completions.create(model=good[0].name, max_tokens=2,
                                               messages=[{"role": "user", "content": "hello world " * 60}])
        assert (too_many_tokens.value.code, too_many_tokens.value.param) == ("prompt_too_long", "messages")
        assert "tokens" in too_many_tokens.value.message and rt.ctx.pending == {}
        acme = openai.AsyncOpenAI(base_url=p.url("serving") + "/v1", api_key="unused", max_retries=0,
                                  http_client=httpx.AsyncClient(auth=IdentityAuth("acme", ("read",)), timeout=60))
        burst = [demo.chat.completions.create(model=good[0].name, messages=MESSAGES, max_tokens=16, temperature=0)
                 for _ in range(4)]
        answers = await asyncio.gather(*burst, acme.chat.completions.create(model=BASE, messages=MESSAGES,
                                                                            max_tokens=2), return_exceptions=True)
        busy = [a for a in answers[:4] if isinstance(a, openai.RateLimitError)]
        assert busy and all(a.code == "too_many_pending_requests" for a in busy), answers
        assert all(a.type == "rate_limit_error" and a.response.headers["retry-after"] == "1" for a in busy)
        assert not isinstance(answers[4], BaseException), answers[4]   # the other tenant was served
        assert rt.ctx.pending == {}                                    # every admitted request left

        # the chat template of training is the one serving renders with, and a recorded template
        # that does not match the artifact's is refused
        reply = await demo.chat.completions.create(model=templated.name, messages=MESSAGES, max_tokens=2)
        tok = rt.ctx.engine.tokenizer
        assert reply.usage.prompt_tokens == len(tok(tok.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=True, chat_template=own_template),
            add_special_tokens=False).input_ids)
        assert reply.usage.prompt_tokens > len(tok(tok.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=True), add_special_tokens=False).input_ids)
        err = await refusal(mismatched.name)
        assert (err.status_code, err.code) == (422, "chat_template_mismatch")

        # archived: unloaded and refused with its own code; quarantine too
        await send_event(b, promoted(good[2], "staging", "archived", base_model=BASE, base_sha256=sha, sequence=2),
                         "demo")
        await wait_until(lambda: _gone(rt, "wsm-g2"), 30, "archived adapter unloaded")
        err = await refusal(good[2].name)
        assert (err.status_code, err.code) == (404, "model_not_deployed") and "archived" in err.message
        # a promotion naming a model of another tenant is dead-lettered, not applied
        await send_event(b, promoted(good[0], "staging", "archived", base_model=BASE, base_sha256=sha, sequence=9),
                         "acme")
        await wait_until(lambda: rt.pool.fetchval("SELECT count(*) > 0 FROM outbox WHERE topic = 'model.promoted.dlq'"),
                         30, "dead letter")
        assert await rt.pool.fetchval("SELECT stage FROM model_versions WHERE model_id = 'wsm-g0'") == "staging"
        # an event of demo's naming weights under acme's prefix is dead-lettered (tenant_mismatch), never projected
        theirs = store_adapter(store, sample_adapters[2], "acme", "wsm-theirs", "ft:tiny-llama:demo:theirs")
        await send_event(b, registered(theirs, base_model=BASE, base_sha256=sha), "demo")
        letter = await wait_until(lambda: rt.pool.fetchval(
            "SELECT value FROM outbox WHERE topic = 'model.registered.dlq'"), 30, "dead letter")
        assert b"tenant_mismatch" in letter
        assert await rt.pool.fetchval("SELECT count(*) FROM model_versions WHERE model_id = 'wsm-theirs'") == 0
        # the same for a checkpoint of demo's naming acme's weights: never recorded, so never served
        await send_event(b, CheckpointWrittenV1(
            job_id="ftjob-theirs", segment_id="ftjob-theirs:1", attempt=1, checkpoint_id="ckpt-1", kind="periodic",
            step=1, uri=theirs.uri, manifest_sha256=theirs.manifest_sha256, files=len(theirs.files), size_bytes=1,
            written_at=datetime.now(UTC)), "demo")
        letter = await wait_until(lambda: rt.pool.fetchval(
            "SELECT value FROM outbox WHERE topic = 'checkpoint.written.dlq'"), 30, "checkpoint dead letter")
        assert b"tenant_mismatch" in letter
        assert await rt.pool.fetchval("SELECT count(*) FROM checkpoints WHERE job_id = 'ftjob-theirs'") == 0


async def _staging(rt, n: int) -> bool:
    return sum(v.stage == "staging" for v in rt.ctx.catalog.versions.values()) == n


async def _gone(rt, model_id: str) -> bool:
    """Archived in the in-memory catalog and out of the engine."""
    return rt.ctx.catalog.versions[model_id].stage == "archived" and not rt.ctx.pool.resident(model_id)
