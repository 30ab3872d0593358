import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import openai
import pytest

from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway


@pytest.fixture
def fake_model(settings) -> str:
    """A catalog entry the scheduler can resolve and pin (sha256 of its weights); not loadable by torch —
    tests that train use the tiny model instead."""
    d = Path(settings.model_catalog) / "pinned-model"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "model.safetensors").write_bytes(b"weights-v1")
    return "pinned-model"


@asynccontextmanager
async def gateway_clients(upstreams: dict[str, str], tenants=("demo", "acme"),
                         retries=(2, 0)) -> AsyncIterator[tuple[openai.AsyncOpenAI, ...]]:
    """The public gateway in front of `upstreams` and one official `openai` client per tenant (each with
    a fresh API key), as a tenant's own code would hold them; the gateway stops on exit."""
    from whetstone.cli.keys import create_key

    gw = await start_gateway(GatewaySettings(), upstreams, port=0)
    try:
        keys = [(await asyncio.to_thread(create_key, t, base_url=upstreams["scheduler"]))["key"] for t in tenants]
        yield tuple(openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=k, max_retries=r)
                    for k, r in zip(keys, retries))
    finally:
        await gw.stop()


@pytest.fixture
def openai_clients():
    """`async with openai_clients(upstreams) as (client, other):` (see gateway_clients)."""
    return gateway_clients
