"""`whet keys|files|jobs` against real services behind the gateway (no training: no trainer runs)."""

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest

from whetstone.cli.main import main
from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.server import start_gateway

pytestmark = pytest.mark.integration
DATASET = Path(__file__).resolve().parents[3] / "examples" / "datasets" / "chat_demo.jsonl"


def whet(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines() + [f"stderr: {captured.err.strip()}"] * (code != 0)


async def test_cli_over_the_public_api(platform, settings, monkeypatch, capsys):
    from whetstone.ingest.bootstrap import build_service as ingest
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.scheduler.bootstrap import build_service as scheduler

    await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
    async with platform(scheduler, ingest) as p:
        gw = await start_gateway(GatewaySettings(), {"scheduler": p.url("scheduler"), "ingest": p.url("ingest")},
                                 port=0)
        try:
            monkeypatch.setenv("WHETSTONE_SCHEDULER_URL", p.url("scheduler"))
            monkeypatch.setenv("WHETSTONE_BASE_URL", f"{gw.url}/v1")

            def run(*argv: str) -> tuple[int, list[str]]:
                return whet(capsys, *argv)

            code, out = await asyncio.to_thread(run, "keys", "create", "demo", "--name", "cli")
            assert code == 0 and out[-1].startswith("wsk-")
            monkeypatch.setenv("WHETSTONE_API_KEY", out[-1])
            code, out = await asyncio.to_thread(run, "keys", "create", "nobody")
            assert code == 1 and "tenant_not_found" in out[-1], out  # unknown tenant: refused, said why
            code, out = await asyncio.to_thread(run, "keys", "list", "--json")
            assert code == 0 and [k["name"] for k in json.loads("\n".join(out))["data"]] == ["cli"]
            # a producer token for external job.requested producers: shown once, listed and revoked like a key
            code, out = await asyncio.to_thread(run, "keys", "create-producer", "demo", "--name", "feed")
            assert code == 0 and out[-1].startswith("whp_") and ".demo." in out[-1] and "producer-token" in out[0], out
            code, out = await asyncio.to_thread(run, "keys", "list", "--json")
            token = next(k for k in json.loads("\n".join(out))["data"] if k["object"] == "producer_token")
            assert token["name"] == "feed" and token["status"] == "active"
            code, out = await asyncio.to_thread(run, "keys", "revoke", token["id"])
            assert code == 0 and out[-1] == f"revoked {token['id']} (tenant demo)"

            code, out = await asyncio.to_thread(run, "files", "upload", str(DATASET), "--wait")
            assert code == 0 and out[-1].startswith("file-") and "processed" in out[0]
            file_id = out[-1]
            code, out = await asyncio.to_thread(run, "files", "get", file_id, "--json")
            assert json.loads("\n".join(out))["status"] == "processed"

            code, out = await asyncio.to_thread(run, "jobs", "create", "--training-file", file_id, "--method", "lora",
                                                "--epochs", "1", "--idempotency-key", "cli-1")
            assert code == 0 and out[-1].startswith("ftjob-")
            job_id = out[-1]
            code, again = await asyncio.to_thread(run, "jobs", "create", "--training-file", file_id, "--method",
                                                  "lora", "--epochs", "1", "--idempotency-key", "cli-1")
            assert again[-1] == job_id   # an idempotent retry
            code, out = await asyncio.to_thread(run, "jobs", "list", "--json")
            listed = json.loads("\n".join(out))   # the API's list object
            assert listed["object"] == "list" and [j["id"] for j in listed["data"]] == [job_id]
            # pause and resume: no node here, so the job waits in the queue; paused it leaves it
            for _ in range(60):
                code, out = await asyncio.to_thread(run, "jobs", "get", job_id, "--json")
                if json.loads("\n".join(out))["status"] != "validating_files":
                    break
                await asyncio.sleep(0.5)
            code, out = await asyncio.to_thread(run, "jobs", "pause", job_id, "--json")
            assert code == 0 and json.loads("\n".join(out))["status"] == "paused", out
            code, out = await asyncio.to_thread(run, "jobs", "resume", job_id, "--json")
            assert code == 0 and json.loads("\n".join(out))["status"] == "queued", out
            code, out = await asyncio.to_thread(run, "jobs", "resume", job_id)
            assert code != 0 and "not_resumable" in out[-1] and "not paused" in out[-1], out
            code, out = await asyncio.to_thread(run, "jobs", "cancel", job_id, "--json")
            assert code == 0 and json.loads("\n".join(out))["status"] in ("cancelled", "queued", "running")
            code, out = await asyncio.to_thread(run, "jobs", "events", job_id)
            assert code == 0 and any("created" in line for line in out), out
            # live events (SSE) stream through the gateway, chunk by chunk, to the end of the job
            lines = []
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
                async with c.stream("GET", f"/v1/fine_tuning/jobs/{job_id}/events", params={"stream": "true"},
                                    headers={"Authorization": f"Bearer {os.environ['WHETSTONE_API_KEY']}"}) as r:
                    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                    async for line in r.aiter_lines():
                        lines.append(line)
                        if line == "data: [DONE]":
                            break
            events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
            assert events and events[0]["object"] == "fine_tuning.job.event" and lines[-1] == "data: [DONE]"
            code, out = await asyncio.to_thread(run, "jobs", "checkpoints", job_id, "--json")
            assert code == 0 and json.loads("\n".join(out))["object"] == "list", out
            code, out = await asyncio.to_thread(run, "jobs", "list")
            assert code == 0 and out[0].startswith(job_id) and "None" not in out[0], out
            code, out = await asyncio.to_thread(run, "files", "list", "--json")
            assert json.loads("\n".join(out))["object"] == "list"
            # a file no job trains on can be deleted
            spare = Path(os.environ["WHETSTONE_DATA_DIR"]) / "spare.jsonl"
            spare.write_text(DATASET.read_text().splitlines()[0] + "\n")
            code, out = await asyncio.to_thread(run, "files", "upload", str(spare))
            code, out = await asyncio.to_thread(run, "files", "delete", out[-1])
            assert code == 0 and out[-1].startswith("deleted file-"), out
            code, out = await asyncio.to_thread(run, "jobs", "get", "ftjob-nope")
            assert code == 1 and "404" in out[-1], out
            # a job with an out-of-range hyperparameter: refused, the field named
            code, out = await asyncio.to_thread(run, "jobs", "create", "--training-file", file_id, "--epochs", "0")
            assert code == 1 and "n_epochs" in out[-1], out
        finally:
            await gw.stop()
            os.environ.pop("WHETSTONE_API_KEY", None)
