"""Fixtures of the scheduler's integration tests: catalog models the scheduler can size, and a
replay of recorded Kubernetes API responses (there is no cluster here)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"


def catalog_model(settings, name: str, config: dict, weights: bytes = b"weights-v1") -> str:
    d = Path(settings.model_catalog) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors").write_bytes(weights)
    return name


@pytest.fixture
def tiny_model(settings) -> str:
    """Sized like the demo's tiny Llama: trains on the CPU node."""
    return catalog_model(settings, "tiny-llama", {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                                  "intermediate_size": 128, "vocab_size": 1536,
                                                  "num_attention_heads": 4, "max_position_embeddings": 512})


@pytest.fixture
def big_model(settings) -> str:
    """A 70B config (the scheduler never loads weights, so a few bytes stand in for them)."""
    return catalog_model(settings, "llama-3-70b", {"model_type": "llama", "hidden_size": 8192,
                                                   "num_hidden_layers": 80, "intermediate_size": 28672,
                                                   "vocab_size": 128256, "num_attention_heads": 64,
                                                   "num_key_value_heads": 8, "max_position_embeddings": 8192})


class KubeApiReplay:
    """Serves GET /api/v1/nodes from recorded responses: the list, then (once released) the
    recorded watch events, which also update what later lists return."""

    def __init__(self) -> None:
        listing = json.loads((FIXTURES / "nodelist.json").read_text())
        self.nodes = {n["metadata"]["name"]: n for n in listing["items"]}
        self.version = listing["metadata"]["resourceVersion"]
        self.events = [json.loads(x) for x in (FIXTURES / "watch_spot_interruption.jsonl").read_text().splitlines()]
        self.release = asyncio.Event()
        self.queries: list[dict] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        if request.query.get("watch", "").lower() not in ("true", "1"):
            return web.json_response({"kind": "NodeList", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": self.version},
                                      "items": list(self.nodes.values())})
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await self.release.wait()
        pending, self.events = self.events, []
        for e in pending:
            obj = e["object"]
            if e["type"] in ("ADDED", "MODIFIED"):
                self.nodes[obj["metadata"]["name"]] = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            elif e["type"] == "DELETED":
                self.nodes.pop(obj["metadata"]["name"], None)
            self.version = obj["metadata"]["resourceVersion"]
            await resp.write((json.dumps(e) + "\n").encode())
            await asyncio.sleep(0.3)
        if not pending:
            await asyncio.sleep(min(float(request.query.get("timeoutSeconds", 1)), 1.0))
        return resp


@pytest.fixture
async def kube_api():
    replay = KubeApiReplay()
    app = web.Application()
    app.router.add_get("/api/v1/nodes", replay.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    replay.url = f"http://127.0.0.1:{port}"
    try:
        yield replay
    finally:
        replay.release.set()
        await runner.cleanup()
