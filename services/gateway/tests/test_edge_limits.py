"""Bodies and fields are bounded at the edge and at the service, on a real
embedded stack: a 200 MB declared body is a 413 before it is read (the gateway and the service
port alike), a streamed one is counted, every field of a job create has a maximum, and the
service ports serve no API documents and no error text on /healthz."""

import asyncio
import time

import httpx
import pytest

from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway

pytestmark = pytest.mark.integration
MB = 1 << 20


async def status_line(port: int, head: str) -> tuple[bytes, float]:
    """Send only the headers (a body that never comes) and read the status line."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode())
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    return line, time.perf_counter() - started


async def test_bodies_and_fields_are_bounded(platform, settings, monkeypatch):
    from whetstone.cli.keys import create_key
    from whetstone.scheduler.bootstrap import build_service as scheduler

    pinned = "org/pinned-1b@" + "c" * 40      # an allow-listed Hub id the operator pinned: no Hub call
    monkeypatch.setenv("WHETSTONE_SCHEDULER_HUB_MODELS", f'["{pinned}"]')
    other = settings.model_catalog.parent / "other-dir"
    other.mkdir(parents=True, exist_ok=True)
    # a model directory outside the catalog (another tenant's, say), complete enough to train from
    (other / "config.json").write_text('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, '
                                       '"intermediate_size": 128, "vocab_size": 1536, "num_attention_heads": 4}')
    (other / "model.safetensors").write_bytes(b"\0" * 4096)

    async with platform(scheduler) as p:
        sched = p.url("scheduler")
        gw = await start_gateway(GatewaySettings(), {"scheduler": sched}, port=0)
        try:
            demo = await asyncio.to_thread(create_key, "demo", base_url=sched)
            auth = {"Authorization": f"Bearer {demo['key']}"}
            head = (f"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {demo['key']}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n")
            for port in (gw.port, int(sched.rsplit(":", 1)[1])):   # the edge, and the service port behind it
                line, took = await status_line(port, head)
                assert line.startswith(b"HTTP/1.1 413") and took < 5, (port, line, took)
            # a chunked body past the cap whose sender then stalls: answered within seconds, nothing held
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write((head.split("Content-Length")[0] + "Transfer-Encoding: chunked\r\n\r\n").encode()
                         + (b"10000\r\n" + b" " * 65536 + b"\r\n") * 24)
            started = time.perf_counter()
            line = await asyncio.wait_for(reader.readline(), 10)
            writer.close()
            assert line.startswith(b"HTTP/1.1 413") and time.perf_counter() - started < 5, line
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
                # 60 million characters of training_file once made a job: now refused unread
                big = await c.post("/v1/fine_tuning/jobs", headers=auth,
                                   json={"model": "tiny-llama", "training_file": "f" * (2 * MB)})
                assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large", big.text

                async def chunks():
                    for _ in range(40):
                        yield b" " * (64 * 1024)

                streamed = await c.post("/v1/fine_tuning/jobs", headers={**auth, "Content-Type": "application/json"},
                                        content=chunks())
                assert streamed.status_code == 413, streamed.text
                # each field has a maximum (OpenAI's where it has one): a 400 naming it
                for body, param in (({"training_file": "f" * 129}, "training_file"),
                                    ({"training_file": "f", "suffix": "s" * 65}, "suffix"),
                                    ({"training_file": "f", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
                                    ({"training_file": "f", "metadata": {"k": "v" * 513}}, "metadata"),
                                    ({"training_file": "f", "model": "m" * 257}, "model"),
                                    ({"training_file": "f", "eval_config": {"x": "y" * 20000}}, "eval_config"),
                                    ({"training_file": "f", "hyperparameters": {f"h{i}": 1 for i in range(41)}},
                                     "hyperparameters")):
                    r = await c.post("/v1/fine_tuning/jobs", headers=auth, json={"model": "tiny-llama", **body})
                    assert r.status_code == 400 and param in (r.json()["error"]["param"] or ""), (param, r.text)
                r = await c.post("/v1/fine_tuning/jobs", headers={**auth, "Idempotency-Key": "k" * 300},
                                 json={"model": "tiny-llama", "training_file": "f"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "Idempotency-Key", r.text
                # file ids and idempotency keys are names, not text: python-looking ones are a 400 naming the field
                pythonish = "__import__('os').system('id') or {{7*7}}"
                for body, param in (({"validation_file": pythonish}, "validation_file"),
                                    ({"training_file": pythonish}, "training_file"),
                                    ({"idempotency_key": pythonish}, "idempotency_key")):
                    r = await c.post("/v1/fine_tuning/jobs", headers=auth,
                                     json={"model": "tiny-llama", "training_file": "ds-none", **body})
                    assert r.status_code == 400 and r.json()["error"]["param"] == param, (param, r.text)
                r = await c.post("/v1/fine_tuning/jobs", headers={**auth, "Idempotency-Key": pythonish},
                                 json={"model": "tiny-llama", "training_file": "ds-none"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "Idempotency-Key", r.text
                # a validation file must be one of the tenant's files, as the training file must
                r = await c.post("/v1/fine_tuning/jobs", headers=auth, json={
                    "model": "org/pinned-1b", "training_file": "ds-none", "validation_file": "file-not-uploaded"})
                err = r.json()["error"]
                assert r.status_code == 400 and (err["code"], err["param"]) == (
                    "validation_file_not_found", "validation_file"), r.text
                # base models are the operator's: catalog names and allow-listed Hub ids, never paths
                catalog = str(settings.model_catalog)
                for ref in ("/etc", str(other), "../other-dir", "~root", "someone/unlisted-model"):
                    started = time.perf_counter()
                    r = await c.post("/v1/fine_tuning/jobs", headers=auth, json={"model": ref, "training_file": "f"})
                    err = r.json()["error"]
                    assert r.status_code == 400 and err["code"] == "unknown_base_model", (ref, r.text)
                    assert catalog not in err["message"].replace(ref, ""), err   # the catalog's place is not told
                    assert time.perf_counter() - started < 5                      # no Hub call for an unlisted id
                ok = await c.post("/v1/fine_tuning/jobs", headers=auth,
                                  json={"model": "org/pinned-1b", "training_file": "ds-none"})
                assert ok.status_code == 200 and ok.json()["model"] == "org/pinned-1b", ok.text
            async with httpx.AsyncClient(base_url=sched, timeout=30) as direct:
                for path in ("/docs", "/openapi.json"):
                    assert (await direct.get(path)).status_code == 404, path
                health = (await direct.get("/healthz")).json()
                assert set(health["checks"].values()) <= {"ok", "unavailable"}, health
        finally:
            await gw.stop()
