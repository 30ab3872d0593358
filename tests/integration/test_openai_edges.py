"""What an OpenAI client sees at the edges of the API, through the gateway with the
official `openai` client: chat parameters the server does not implement are refused with a 400 naming
the parameter (never silently ignored), unknown routes answer in OpenAI's error shape, and every
refusal, the services' own 403s included, is counted in `whetstone_refused_total`."""

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from whetstone.cli.dev import upstreams_of
from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway

pytestmark = pytest.mark.integration
MESSAGES = [{"role": "user", "content": "Hello"}]


def refused_total(metrics: str, reason: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("whetstone_refused_total{") and f'reason="{reason}"' in line)


async def test_chat_parameters_unknown_routes_and_refusal_counts(platform, settings):
    from whetstone.cli.keys import create_key
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.registry.bootstrap import build_service as registry
    from whetstone.scheduler.bootstrap import build_service as scheduler
    from whetstone.serving.bootstrap import build_service as serving
    from whetstone.serving.config import ServingSettings

    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    async with platform(scheduler, registry, lambda: serving(ServingSettings(http_port=0, preload=False))) as p:
        upstreams = upstreams_of(p.runtimes.values())
        gw = await start_gateway(GatewaySettings(), upstreams, port=0)
        try:
            key = (await asyncio.to_thread(create_key, "demo", base_url=upstreams["scheduler"]))["key"]
            reader = (await asyncio.to_thread(create_key, "demo", scopes=["read"],
                                              base_url=upstreams["scheduler"]))["key"]
            client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)

            # -- parameters the server does not implement: 400 naming the parameter, before any model lookup
            cases = [({"logprobs": True}, "logprobs"), ({"top_logprobs": 2, "logprobs": True}, "logprobs"),
                     ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
                     ({"response_format": {"type": "json_object"}}, "response_format"),
                     ({"presence_penalty": 0.5}, "presence_penalty"), ({"logit_bias": {"1": 5}}, "logit_bias"),
                     ({"extra_body": {"top_k": 5}}, "top_k")]
            for kwargs, param in cases:
                with pytest.raises(openai.BadRequestError) as err:
                    await client.chat.completions.create(model="no-such-model", messages=MESSAGES, **kwargs)
                assert err.value.body["param"] == param and param in err.value.message, (kwargs, err.value.body)
                assert err.value.code in ("unsupported_parameter", "unknown_parameter")
            with pytest.raises(openai.BadRequestError) as err:
                await client.chat.completions.create(
                    model="no-such-model", messages=[{"role": "user", "content": "hi", "name": "bob"}])
            assert err.value.body["param"] == "messages[0].name"
            with pytest.raises(openai.BadRequestError) as err:
                await client.completions.create(model="no-such-model", prompt="hi", echo=True)
            assert err.value.body["param"] == "echo"
            # their defaults ask for nothing and are accepted: the request reaches the model lookup
            with pytest.raises(openai.NotFoundError) as err:
                await client.chat.completions.create(
                    model="no-such-model", messages=MESSAGES, logprobs=False, response_format={"type": "text"},
                    frequency_penalty=0, presence_penalty=0, n=2, seed=1, metadata={"run": "x"})
            assert err.value.code == "model_not_found"

            # -- unknown routes: OpenAI's error shape, on a known service's prefix and outside every prefix
            async with httpx.AsyncClient(base_url=gw.url, timeout=30,
                                         headers={"Authorization": f"Bearer {key}"}) as c:
                for method, path in (("GET", "/v1/fine_tuning/nope"), ("GET", "/v1/models/x/nope/deeper"),
                                     ("GET", "/v1/chat/completions/extra"), ("DELETE", "/v1/fine_tuning/jobs"),
                                     ("GET", "/v1/nothing-here")):
                    r = await c.request(method, path)
                    assert r.status_code in (404, 405), (path, r.status_code, r.text)
                    body = r.json()
                    assert "detail" not in body and set(body["error"]) == {"message", "type", "param", "code"}, body
                    assert body["error"]["code"] in ("unknown_url", "method_not_allowed"), body
                # ... and on each service's own port (every service app installs the runtime's error handlers)
                for name, url in upstreams.items():
                    r = await c.get(f"{url}/v1/nothing-here")
                    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url", (name, r.text)
                # -- a service's own 403 (a read-only key creating a job) is counted with the edge's refusals
                before = refused_total((await c.get("/metrics")).text, "forbidden")
                r = await c.post("/v1/fine_tuning/jobs", json={"model": "tiny-llama", "training_file": "ds-x"},
                                 headers={"Authorization": f"Bearer {reader}"})
                assert r.status_code == 403, r.text
                assert refused_total((await c.get("/metrics")).text, "forbidden") == before + 1
                assert refused_total((await c.get("/metrics")).text, "unknown_route") >= 1
        finally:
            await gw.stop()
