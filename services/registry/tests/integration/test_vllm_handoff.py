"""The vLLM handoff loader against recorded vLLM responses, served by a real local HTTP server
(vLLM itself cannot run here)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from whetstone.registry.adapters.vllm import VllmFleet, lay_out_for_resolver, lorax_adapter

pytestmark = pytest.mark.integration
RECORDED = json.loads((Path(__file__).parent.parent / "fixtures" / "vllm_recorded.json").read_text())


def fill(value, **kw):
    if isinstance(value, str):
        return value.replace("{name}", kw.get("name", "")).replace("{path}", kw.get("path", ""))
    if isinstance(value, dict):
        return {k: fill(v, **kw) for k, v in value.items()}
    return value


class RecordedVllm(BaseHTTPRequestHandler):
    """Replays the recorded responses; keeps which adapters are loaded, like the server would."""

    loaded: dict[str, str]
    calls: list[tuple[str, dict]]

    def log_message(self, *args):
        pass

    def reply(self, recorded: dict, **kw):
        body = fill(recorded["body"], **kw)
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(recorded["status"])
        self.send_header("Content-Type", recorded["content_type"])
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        assert self.path == "/v1/models"
        listing = json.loads(json.dumps(RECORDED["models"]))
        for name, path in self.server.loaded.items():
            listing["data"].append({**RECORDED["lora_model_entry"], "id": name, "root": path, "parent": "tiny-llama"})
        self.reply({"status": 200, "content_type": "application/json", "body": listing})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.calls.append((self.path, body))
        name = body["lora_name"]
        if self.path == "/v1/load_lora_adapter":
            if name in self.server.loaded:
                return self.reply(RECORDED["load_twice"], name=name)
            if not Path(body["lora_path"], "adapter_config.json").exists():
                return self.reply(RECORDED["load_missing_path"], name=name, path=body["lora_path"])
            self.server.loaded[name] = body["lora_path"]
            return self.reply(RECORDED["load_ok"], name=name)
        if self.path == "/v1/unload_lora_adapter":
            if self.server.loaded.pop(name, None) is None:
                return self.reply(RECORDED["unload_unknown"], name=name)
            return self.reply(RECORDED["unload_ok"], name=name)
        self.send_error(404)


@pytest.fixture
def vllm_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordedVllm)
    server.loaded, server.calls = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def adapter(tmp: Path, name: str) -> Path:
    d = tmp / "src" / name
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"weights " + name.encode())
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "base_model_name_or_path": None}))
    return d


async def test_fleet_follows_promotions_and_rollback(vllm_server, tmp_path):
    url = f"http://127.0.0.1:{vllm_server.server_address[1]}"
    root = tmp_path / "loras"
    v1 = lay_out_for_resolver(root, "v1", adapter(tmp_path, "v1"), "tiny-llama")
    v2 = lay_out_for_resolver(root, "v2", adapter(tmp_path, "v2"), "tiny-llama")
    assert json.loads((v1 / "adapter_config.json").read_text()) == {
        "peft_type": "LORA", "r": 8, "base_model_name_or_path": "tiny-llama"}
    fleet = VllmFleet([url])
    try:
        report = await fleet.sync({"ft:tiny-llama:demo:support": str(v1)})
        assert report.loaded == [(url, "ft:tiny-llama:demo:support")] and not report.errors
        assert (await fleet.sync({"ft:tiny-llama:demo:support": str(v1)})).loaded == []  # idempotent
        assert await fleet.load(url, "ft:tiny-llama:demo:support", str(v1)) is False  # recorded 400: already loaded
        # promotion of v2 under the same name: unload + load
        await fleet.sync({"ft:tiny-llama:demo:support": str(v2)})
        assert vllm_server.loaded == {"ft:tiny-llama:demo:support": str(v2)}
        # rollback = unload + load of the previous version
        vllm_server.calls.clear()
        await fleet.swap(url, "ft:tiny-llama:demo:support", str(v1))
        assert [c[0] for c in vllm_server.calls] == ["/v1/unload_lora_adapter", "/v1/load_lora_adapter"]
        assert vllm_server.loaded == {"ft:tiny-llama:demo:support": str(v1)}
        # archive: the name leaves the fleet; unloading an unknown name is done, not an error
        report = await fleet.sync({})
        assert report.unloaded == [(url, "ft:tiny-llama:demo:support")] and vllm_server.loaded == {}
        assert await fleet.unload(url, "ghost") is False
        # a path vLLM cannot load is an error the report names; other servers still move
        report = await fleet.sync({"broken": str(tmp_path / "nowhere")})
        assert report.errors and "No adapter found" in report.errors[0]
    finally:
        await fleet.close()


def test_resolver_layout_refuses_pickles_and_bad_names(tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "adapter_model.bin").write_bytes(b"pickle")
    (d / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="safetensors"):
        lay_out_for_resolver(tmp_path / "loras", "x", d, "tiny-llama")
    with pytest.raises(ValueError, match="invalid lora name"):
        lay_out_for_resolver(tmp_path / "loras", "../x", d, "tiny-llama")
    assert lorax_adapter("s3://whetstone/tenants/demo/jobs/j/checkpoints/final/") == {
        "adapter_id": "s3://whetstone/tenants/demo/jobs/j/checkpoints/final", "adapter_source": "s3"}


async def test_registry_hands_promotions_and_rollbacks_to_the_fleet(platform, kit, vllm_server, tmp_path, monkeypatch):
    import httpx

    from whetstone.contracts import Metric
    from whetstone.devstack.testing import wait_until
    from whetstone.registry.bootstrap import build_service

    url = f"http://127.0.0.1:{vllm_server.server_address[1]}"
    monkeypatch.setenv("WHETSTONE_REGISTRY_VLLM_URLS", json.dumps([url]))
    monkeypatch.setenv("WHETSTONE_REGISTRY_VLLM_ADAPTER_DIR", str(tmp_path / "loras"))
    monkeypatch.setenv("WHETSTONE_REGISTRY_VLLM_SYNC_INTERVAL_S", "0.2")
    monkeypatch.setenv("WHETSTONE_REGISTRY_AUTO_PROMOTE", "true")
    async with platform(build_service) as p:
        v1 = await kit.register(p, "ftjob-h1")  # thin eval margins: staging, waits for a human
        v2 = await kit.register(p, "ftjob-h2")
        # wide margins: the auto-promotion policy takes it to production at registration
        auto = await kit.register(p, "ftjob-h3", suffix="auto", stage="production",
                                  metrics=[Metric(name="holdout_loss", base=2.0, candidate=1.0)])
        approval = await p["registry"].pool.fetchval(
            "SELECT approval FROM stage_history WHERE model_id = $1 AND to_stage = 'production'", auto)
        assert approval == "auto"
        await wait_until(lambda: _loaded(vllm_server, "ft:tiny-llama:demo:auto", auto), 30, "auto-promoted in vLLM")
        promoter = kit.auth("demo", "read", "write", "models:promote")
        name = "ft:tiny-llama:demo:support"

        async def serving(model_id):
            path = vllm_server.loaded.get(name)
            return path is not None and path.endswith(model_id)
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            await c.post(f"/v1/models/{v1}/promote", json={"stage": "production", "reason": "go"}, auth=promoter)
            await wait_until(lambda: serving(v1), 30, "v1 loaded in vLLM")
            config = json.loads((tmp_path / "loras" / v1 / "adapter_config.json").read_text())
            assert config["base_model_name_or_path"] == kit.BASE and config["peft_type"] == "LORA"
            await c.post(f"/v1/models/{v2}/promote", json={"stage": "production", "reason": "go"}, auth=promoter)
            await wait_until(lambda: serving(v2), 30, "v2 swapped in")
            await c.post(f"/v1/models/{v2}/rollback", json={"reason": "bad"}, auth=promoter)
            await wait_until(lambda: serving(v1), 30, "rollback in vLLM")


async def _loaded(server, name, model_id):
    path = server.loaded.get(name)
    return path is not None and path.endswith(model_id)
