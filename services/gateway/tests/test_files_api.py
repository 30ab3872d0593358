"""The Files API (owned by ingest) through the gateway, on a real embedded stack."""

import asyncio
import json
import time

import httpx
import pytest

from whetstone.contracts import JobCancelledV1, JobQueuedV1, Resources, TrainingSpec
from whetstone.devstack.testing import send_event, wait_until
from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway

pytestmark = pytest.mark.integration
LIMIT = 64_000


def chat_rows(n: int, bad_lines: tuple[int, ...] = ()) -> bytes:
    rows = []
    for i in range(n):
        if i + 1 in bad_lines:
            rows.append({"messages": [{"role": "user", "content": f"q{i}"}]})  # no assistant turn
            continue
        rows.append({"messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": f"What is {i} + {i}?"},
                                  {"role": "assistant", "content": "I think 1.", "weight": 0},
                                  {"role": "user", "content": "Sure?"},
                                  {"role": "assistant", "content": f"{i} + {i} = {2 * i}.", "weight": 1}]})
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def preference_rows(n: int) -> bytes:
    rows = [{"input": {"messages": [{"role": "user", "content": f"Name a colour #{i}."}]},
             "preferred_output": [{"role": "assistant", "content": f"Blue, number {i}."}],
             "non_preferred_output": [{"role": "assistant", "content": "No."}]} for i in range(n)]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


async def wait_status(c: httpx.AsyncClient, file_id: str, headers: dict, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        f = (await c.get(f"/v1/files/{file_id}", headers=headers)).json()
        if f["status"] != "uploaded":
            return f
        assert time.monotonic() < deadline, f"file {file_id} still uploaded after {timeout}s"
        await asyncio.sleep(0.3)


async def test_files_upload_validate_list_download_delete(platform, monkeypatch):
    monkeypatch.setenv("WHETSTONE_INGEST_MAX_UPLOAD_BYTES", str(LIMIT))
    from whetstone.cli.keys import create_key
    from whetstone.ingest.bootstrap import build_service as ingest
    from whetstone.scheduler.bootstrap import build_service as scheduler

    async with platform(scheduler, ingest) as p:
        gw = await start_gateway(GatewaySettings(), {"scheduler": p.url("scheduler"), "ingest": p.url("ingest")},
                                 port=0)
        try:
            demo = await asyncio.to_thread(create_key, "demo", base_url=p.url("scheduler"))
            acme = await asyncio.to_thread(create_key, "acme", base_url=p.url("scheduler"))
            auth, other = ({"Authorization": f"Bearer {k['key']}"} for k in (demo, acme))
            async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
                sft = chat_rows(14)
                r = await c.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                                 files={"file": ("train.jsonl", sft, "application/jsonl")})
                assert r.status_code == 200, r.text
                f = r.json()
                assert f["object"] == "file" and f["bytes"] == len(sft) and f["filename"] == "train.jsonl"
                assert f["purpose"] == "fine-tune" and f["status"] == "uploaded" and f["id"].startswith("file-")
                done = await wait_status(c, f["id"], auth)
                assert done["status"] == "processed", done
                assert done["validation"]["rows_kept"] == 14
                # the preference format (DPO) reaches validation as a dpo dataset
                r = await c.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                                 files={"file": ("prefs.jsonl", preference_rows(12), "application/jsonl")})
                assert r.status_code == 200 and r.json()["dataset_purpose"] == "dpo", r.text
                pref = await wait_status(c, r.json()["id"], auth)
                assert pref["validation"] is not None and pref["validation"]["status"] in ("accepted", "rejected")
                # a file with bad lines: status error, the report names the lines
                r = await c.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                                 files={"file": ("bad.jsonl", chat_rows(12, bad_lines=(3, 7)) + b"{not json\n",
                                                 "application/jsonl")})
                bad = await wait_status(c, r.json()["id"], auth)
                assert bad["status"] == "error" and "line 13" in bad["status_details"], bad
                assert any(e.get("line") == 13 for e in bad["validation"]["errors"])
                # listing: newest first, paged with has_more
                page = (await c.get("/v1/files", headers=auth, params={"limit": 2})).json()
                assert page["has_more"] is True and len(page["data"]) == 2
                rest = (await c.get("/v1/files", headers=auth, params={"limit": 2, "after": page["last_id"]})).json()
                assert rest["has_more"] is False and [x["id"] for x in rest["data"]] == [f["id"]]
                # the platform's own purpose for reinforcement data is taken as sent
                rft = b"".join(json.dumps({"messages": [{"role": "user", "content": f"Say {i}."}], "answer": str(i)}
                                          ).encode() + b"\n" for i in range(12))
                r = await c.post("/v1/files", headers=auth, data={"purpose": "rft"},
                                 files={"file": ("rft.jsonl", rft, "application/jsonl")})
                assert r.status_code == 200 and r.json()["dataset_purpose"] == "rft", r.text
                assert (await c.delete(f"/v1/files/{r.json()['id']}", headers=auth)).status_code == 200
                # download streams the exact bytes back
                r = await c.get(f"/v1/files/{f['id']}/content", headers=auth)
                assert r.status_code == 200 and r.content == sft
                # another tenant: 404 on every route, never the data
                for method, path in (("GET", f"/v1/files/{f['id']}"), ("GET", f"/v1/files/{f['id']}/content"),
                                     ("DELETE", f"/v1/files/{f['id']}")):
                    r = await c.request(method, path, headers=other)
                    assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found", (path, r.text)
                assert (await c.get("/v1/files", headers=other)).json()["data"] == []
                # bad input: over the limit, no file part, a wrong purpose, not multipart
                r = await c.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                                 files={"file": ("big.jsonl", chat_rows(600), "application/jsonl")})
                assert r.status_code == 413 and r.json()["error"]["param"] == "file", r.text
                # larger than the gateway's buffer (1 MiB): streamed through it, stopped by ingest at the limit
                r = await c.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                                 files={"file": ("huge.jsonl", chat_rows(6000), "application/jsonl")})
                assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large", r.text
                r = await c.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                                 files={"other": ("x.jsonl", b"{}", "application/jsonl")})
                assert r.status_code == 400 and r.json()["error"]["code"] == "missing_file"
                r = await c.post("/v1/files", headers=auth, data={"purpose": "assistants"},
                                 files={"file": ("x.jsonl", sft, "application/jsonl")})
                assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
                r = await c.post("/v1/files", headers=auth, json={"purpose": "fine-tune"})
                assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_type"
                assert len((await c.get("/v1/files", headers=auth)).json()["data"]) == 3  # nothing partial
                # a job uses the file: deletion refused until it ends
                spec = TrainingSpec(base_model="tiny", base_model_sha256="0" * 64, dataset_id=f["id"],
                                    dataset_version="v", train_uri="s3://whetstone/x", method="lora",
                                    hyperparameters={}, hyperparameters_hash="h")
                await send_event(p.settings.kafka_bootstrap, JobQueuedV1(
                    job_id="ftjob-files-1", tier="standard", spec=spec,
                    resources=Resources(gpu_type="cpu", gpus_per_node=1)), "demo")

                usage = "SELECT count(*) FROM file_usage WHERE job_id = 'ftjob-files-1' AND ended_at IS {} NULL"
                await wait_until(lambda: p["ingest"].pool.fetchval(usage.format("")), 30, "job.queued projected")
                r = await c.delete(f"/v1/files/{f['id']}", headers=auth)
                assert r.status_code == 409 and r.json()["error"]["code"] == "file_in_use", r.text
                assert r.headers["x-should-retry"] == "false"
                await send_event(p.settings.kafka_bootstrap, JobCancelledV1(job_id="ftjob-files-1"), "demo")
                await wait_until(lambda: p["ingest"].pool.fetchval(usage.format("NOT")), 30, "job end projected")
                r = await c.delete(f"/v1/files/{f['id']}", headers=auth)
                assert r.status_code == 200 and r.json() == {"id": f["id"], "object": "file", "deleted": True}
                assert (await c.get(f"/v1/files/{f['id']}", headers=auth)).status_code == 404
        finally:
            await gw.stop()
