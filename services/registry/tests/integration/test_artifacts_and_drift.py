"""Downloads by presigned URL (verified, never a pickle), merged weights, and the base-model SHA
drift guard — against the real embedded stack."""

import asyncio
import hashlib
import json
import socket
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from whetstone.contracts import CheckpointWrittenV1, EvalCompletedV1, ModelMergedV1
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.registry.bootstrap import build_service
from whetstone.runtime.checkpoints import upload_checkpoint

pytestmark = pytest.mark.integration
PROMOTER = ("read", "write", "models:promote")


async def test_download_verifies_every_file_and_merged_weights_come_from_a_job(platform, kit):
    async with platform(build_service) as p:
        rt = p["registry"]
        processor = json.dumps({"processor_class": "LlavaProcessor", "image_token": "<image>"}).encode()
        model = await kit.register(p, "ftjob-dl", extra={"training_args.bin": b"pickle!",
                                                         "processor_config.json": processor})
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            r = await c.get(f"/v1/models/{model}/content", auth=kit.auth("demo"))
            assert r.status_code == 200, r.text
            body = r.json()
            names = [f["name"] for f in body["files"]]
            assert names[:2] == ["adapter_model.safetensors", "adapter_config.json"]
            assert not any(n.endswith(".bin") for n in names)
            assert "README.md" in names and body["manifest"]["README.md"]
            assert "processor_config.json" in names   # a vision adapter's processor comes with it
            async with httpx.AsyncClient() as anon:  # presigned: no identity needed
                for f in body["files"]:
                    data = (await anon.get(f["url"])).content
                    assert hashlib.sha256(data).hexdigest() == f["sha256"], (f, data[:300])
                    assert hashlib.sha256(data).hexdigest() == f["sha256"] == body["manifest"][f["name"]]
                    if f["name"] == "README.md":
                        assert data.startswith(b"---\nbase_model: tiny-llama\n") and b"model-index:" in data
                    if f["name"] == "adapter_config.json":
                        config = json.loads(data)
                        assert config["base_model_name_or_path"] == kit.BASE and config["peft_type"] == "LORA"
            # someone overwrites the adapter in S3: nothing is served
            rt.store.put_bytes("tenants/demo/jobs/ftjob-dl/checkpoints/final/adapter_model.safetensors", b"evil")
            r = await c.get(f"/v1/models/{model}/download", auth=kit.auth("demo"))
            assert r.status_code == 409 and r.json()["error"]["code"] == "artifact_corrupted"
            assert "adapter_model.safetensors" in r.json()["error"]["message"]

            # merged weights: recorded, asked of the queue, served once a merge job answered
            r = await c.get(f"/v1/models/{model}/merged", auth=kit.auth("demo"))
            assert r.status_code == 404 and r.json()["error"]["code"] == "merge_not_requested"
            r = await c.post(f"/v1/models/{model}/merged", auth=kit.auth("demo"))
            assert r.status_code == 200 and r.json()["status"] == "requested"
            again = await c.post(f"/v1/models/{model}/merged", auth=kit.auth("demo"))
            assert again.json()["id"] == r.json()["id"]
            requested = await outbox(rt, "model.merge_requested")
            assert len(requested) == 1 and requested[0]["payload"]["model_id"] == model
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "model.safetensors").write_bytes(b"merged weights")
                (Path(tmp) / "config.json").write_text("{}")
                up = upload_checkpoint(rt.store, Path(tmp), f"tenants/demo/models/{model}/merged", {"model_id": model})
            await send_event(p.settings.kafka_bootstrap, ModelMergedV1(
                merge_id=r.json()["id"], model_id=model, status="succeeded", uri=up.uri, manifest_sha256=up.manifest_sha256,
                files={"model.safetensors": hashlib.sha256(b"merged weights").hexdigest(),
                       "config.json": hashlib.sha256(b"{}").hexdigest()}, merge_job_id="ftjob-merge-1"), "demo")

            async def merged():
                v = (await c.get(f"/v1/models/{model}/merged", auth=kit.auth("demo"))).json()
                return v if v["status"] == "succeeded" else None
            view = await wait_until(merged, 30, "merge answer")
            assert view["merge_job_id"] == "ftjob-merge-1"
            data = (await c.get(view["files"][0]["url"])).content
            assert hashlib.sha256(data).hexdigest() == view["files"][0]["sha256"]


        # registration refuses what it cannot vouch for: a manifest that is not the announced one, an
        # artifact under another tenant's prefix -> dead letters naming why, no model
        uri, digest = kit.upload_artifact(rt.store, "demo", "ftjob-forged")
        await send_event(p.settings.kafka_bootstrap, CheckpointWrittenV1(
            job_id="ftjob-forged", segment_id="s", checkpoint_id="c", kind="final", step=1, uri=uri,
            manifest_sha256="0" * 64, files=4, size_bytes=1, written_at=datetime.now(UTC)), "demo")
        await send_event(p.settings.kafka_bootstrap, CheckpointWrittenV1(
            job_id="ftjob-stolen", segment_id="s", checkpoint_id="c", kind="final", step=1, uri=uri,
            manifest_sha256=digest, files=4, size_bytes=1, written_at=datetime.now(UTC)), "acme")
        letters = await wait_until(lambda: _two(outbox(rt, "checkpoint.written.dlq")), 30, "two dead letters")
        errors = sorted(x["payload"]["error"] for x in letters)
        assert "not the announced" in errors[0] and "not under tenant acme" in errors[1]
        assert await rt.pool.fetchval("SELECT count(*) FROM final_checkpoints WHERE job_id IN ('ftjob-forged', 'ftjob-stolen')") == 0


async def _two(rows):
    rows = await rows
    return rows if len(rows) >= 2 else None


async def test_new_base_sha_requires_reeval_before_the_fleet_moves(platform, kit):
    async with platform(build_service) as p:
        rt = p["registry"]
        prod = await kit.register(p, "ftjob-prod")
        other = await kit.register(p, "ftjob-acme", tenant="acme", suffix="x")
        admin = kit.auth("platform", "admin")
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            r = await c.post(f"/v1/models/{prod}/promote", json={"stage": "production", "reason": "go"},
                             auth=kit.auth("demo", *PROMOTER))
            assert r.status_code == 200
            catalog = (await c.get(f"/v1/base_models/{kit.BASE}", auth=admin)).json()
            assert catalog["sha256"] == kit.BASE_SHA and len(catalog["versions"]) == 1
            check = (await c.get(f"/v1/base_models/{kit.BASE}/rollout-check", auth=admin)).json()
            assert check["may_roll_out"] and check["checked"] == 0

            new_sha = "b" * 64
            r = await c.post(f"/v1/base_models/{kit.BASE}/versions", json={"sha256": new_sha, "reason": "upstream fix"},
                             auth=kit.auth("demo", *PROMOTER))
            assert r.status_code == 403
            r = await c.post(f"/v1/base_models/{kit.BASE}/versions", json={"sha256": "nope"}, auth=admin)
            assert r.status_code == 400 and r.json()["error"]["param"] == "sha256"
            r = await c.post(f"/v1/base_models/{kit.BASE}/versions", json={"sha256": new_sha, "reason": "upstream fix"},
                             auth=admin)
            assert r.status_code == 200, r.text
            assert sorted(r.json()["needs_reeval"]) == sorted([prod, other])
            r = await c.post(f"/v1/base_models/{kit.BASE}/versions", json={"sha256": new_sha}, auth=admin)
            assert r.status_code == 409 and r.json()["error"]["code"] == "already_current"

            updated = await outbox(rt, "base_model.updated")
            assert updated[0]["payload"] == {**updated[0]["payload"], "name": kit.BASE, "sha256": new_sha,
                                             "previous_sha256": kit.BASE_SHA}
            asks = {e["payload"]["model_id"]: e for e in await outbox(rt, "eval.requested")}
            assert set(asks) == {prod, other} and asks[other]["tenant_id"] == "acme"
            assert asks[prod]["payload"]["base_model_sha256"] == new_sha

            view = (await c.get(f"/v1/models/{prod}", auth=kit.auth("demo"))).json()
            assert view["needs_reeval"] and view["stage"] == "production"
            r = await c.post(f"/v1/models/{other}/promote", json={"stage": "production", "reason": "x"},
                             auth=kit.auth("acme", *PROMOTER))
            assert r.status_code == 409 and r.json()["error"]["code"] == "needs_reeval"
            check = (await c.get(f"/v1/base_models/{kit.BASE}/rollout-check", auth=admin)).json()
            assert not check["may_roll_out"] and [b["model_id"] for b in check["blockers"]] == [prod]
            assert check["blockers"][0]["reeval_status"] == "requested"
            assert (await c.get(f"/v1/base_models/{kit.BASE}/rollout-check",
                                auth=kit.auth("demo", *PROMOTER))).status_code == 403

            # eval answers the command: a failure keeps blocking, a pass unblocks
            ask = asks[prod]["payload"]
            await send_event(p.settings.kafka_bootstrap, EvalCompletedV1(
                job_id=ask["job_id"], checkpoint_uri=ask["checkpoint_uri"], verdict="passed", reasons=["ok on new base"],
                metrics=[], request_id=ask["request_id"], base_model_sha256=new_sha), "demo", times=2)

            async def unblocked():
                return (await c.get(f"/v1/base_models/{kit.BASE}/rollout-check", auth=admin)).json()["may_roll_out"]
            await wait_until(unblocked, 30, "rollout check to pass")
            assert not (await c.get(f"/v1/models/{prod}", auth=kit.auth("demo"))).json()["needs_reeval"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def cli_download(p, monkeypatch, capsys, model: str, out: Path, port: int | None = None) -> dict:
    """`whet models download MODEL --json` through a real gateway (a key of tenant demo): the listing it
    printed, after checking every file it wrote against the listing's sha256."""
    from whetstone.cli.dev import upstreams_of
    from whetstone.cli.keys import create_key
    from whetstone.cli.main import main
    from whetstone.gateway.config import GatewaySettings
    from whetstone.gateway.server import start_gateway

    gw = await start_gateway(GatewaySettings(), upstreams_of(p.runtimes.values()), port=port or 0)
    try:
        key = (await asyncio.to_thread(create_key, "demo", base_url=p.url("scheduler")))["key"]
        monkeypatch.setenv("WHETSTONE_BASE_URL", f"{gw.url}/v1")
        monkeypatch.setenv("WHETSTONE_API_KEY", key)
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["models", "download", model, "--out", str(out), "--json"])
        printed = capsys.readouterr()
        assert code == 0, printed.err
        listing = json.loads(printed.out)
    finally:
        await gw.stop()
    for f in listing["files"]:
        assert hashlib.sha256((out / f["name"]).read_bytes()).hexdigest() == f["sha256"], f["name"]
    return listing


async def test_downloads_through_the_public_api_when_the_object_store_is_out_of_reach(platform, kit, monkeypatch,
                                                                                       capsys, tmp_path):
    """With `public_base_url` set, the listing points at the API: each file is streamed by the
    registry to a caller with a read key, verified first; no presigned object-store URL is handed out.
    `whet models download` works both ways through the gateway: from the API with the key, and (the
    setting unset, services restarted) from presigned object-store URLs without it."""
    from whetstone.scheduler.bootstrap import build_service as scheduler

    port = free_port()
    public = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("WHETSTONE_REGISTRY_PUBLIC_BASE_URL", public + "/")
    async with platform(build_service, scheduler) as p:
        rt = p["registry"]
        model = await kit.register(p, "ftjob-public-dl")
        listing = await cli_download(p, monkeypatch, capsys, model, tmp_path / "via-api", port)
        assert {f["name"] for f in listing["files"]} >= {"adapter_model.safetensors", "adapter_config.json"}
        assert all(f["url"].startswith(f"{public}/v1/models/{model}/files/") for f in listing["files"]), listing
        async with httpx.AsyncClient(base_url=p.url("registry")) as c:
            body = (await c.get(f"/v1/models/{model}/content", auth=kit.auth("demo"))).json()
            assert {f["name"] for f in body["files"]} >= {"adapter_model.safetensors", "adapter_config.json"}
            for f in body["files"]:
                assert f["url"] == f"{public}/v1/models/{model}/files/{f['name']}", f["url"]
                path = f["url"].removeprefix(public)
                r = await c.get(path, auth=kit.auth("demo"))
                assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == f["sha256"], f["name"]
            weights = f"/v1/models/{model}/files/adapter_model.safetensors"
            assert (await c.get(weights)).status_code == 401                          # a key is required
            assert (await c.get(weights, auth=kit.auth("acme"))).status_code == 404   # another tenant's
            r = await c.get(f"/v1/models/{model}/files/training_args.bin", auth=kit.auth("demo"))
            assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found"
            rt.store.put_bytes("tenants/demo/jobs/ftjob-public-dl/checkpoints/final/adapter_model.safetensors", b"evil")
            r = await c.get(weights, auth=kit.auth("demo"))
            assert r.status_code == 409 and r.json()["error"]["code"] == "artifact_corrupted"

    monkeypatch.delenv("WHETSTONE_REGISTRY_PUBLIC_BASE_URL")
    async with platform(build_service, scheduler) as p:
        model = await kit.register(p, "ftjob-presigned-dl")
        listing = await cli_download(p, monkeypatch, capsys, model, tmp_path / "presigned")
        s3 = p.settings.s3_endpoint.rstrip("/")
        assert all(f["url"].startswith(s3 + "/") for f in listing["files"]), (s3, listing)
