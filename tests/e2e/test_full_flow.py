"""One LoRA fine-tune through all six services over Kafka, on the real embedded stack."""

import hashlib
from pathlib import Path

import httpx
import pytest

from whetstone.modelkit.tiny import build_tiny_model
from whetstone.cli.dev import all_service_builders
from whetstone.cli.main import submit_dataset
from whetstone.devstack.job_flow import create_and_follow
from whetstone.runtime.identity import IdentityAuth
from whetstone.runtime.models import resolve_model
from whetstone.devstack.testing import outbox

pytestmark = pytest.mark.e2e
DATASET = Path(__file__).resolve().parents[2] / "examples" / "datasets" / "chat_demo.jsonl"


async def test_fine_tune_flows_through_all_six_services(platform, settings):
    build_tiny_model(Path(settings.model_catalog) / "tiny-llama")
    async with platform(*all_service_builders()) as p:
        ports = {name: rt.http.port for name, rt in p.runtimes.items()}
        dataset_id = await submit_dataset(settings, DATASET, "demo")
        body = {"model": "tiny-llama", "training_file": dataset_id, "method": "lora",
                "hyperparameters": {"n_epochs": 1, "learning_rate": 2e-3, "batch_size": 8, "max_seq_len": 256,
                                    "checkpoint_every_steps": 8, "lora_r": 8}}
        result = await create_and_follow(ports, "demo", body, key="e2e-1")

        job, model, usage = result["job"], result["model"], result["usage"]
        assert job["status"] == "succeeded", job
        assert job["eval"]["verdict"] == "passed", job["eval"]
        loss = next(m for m in job["eval"]["metrics"] if m["name"] == "holdout_loss")
        assert loss["candidate"] < loss["base"]

        # lineage: base model pinned by the sha256 of its weights, dataset by the sha256 of its bytes
        lineage = model["lineage"]
        assert lineage["base_model_sha256"] == resolve_model("tiny-llama", settings.model_catalog).sha256
        assert lineage["dataset_version"] == hashlib.sha256(DATASET.read_bytes()).hexdigest()
        assert lineage["dataset_id"] == dataset_id and lineage["job_id"] == job["id"]
        assert lineage["hyperparameters_hash"] and lineage["eval_verdict"] == "passed"
        assert model["stage"] == "staging"
        assert [h["to_stage"] for h in model["stage_history"]] == ["dev", "staging"]

        # the registered artifact is a durable checkpoint: manifest + PEFT adapter files in S3
        store = p["registry"].store
        prefix = model["artifact_uri"].split("/", 3)[3]
        keys = {k.rsplit("/", 1)[-1] for k in store.list_keys(prefix)}
        assert {"manifest.json", "adapter_model.safetensors", "adapter_config.json"} <= keys

        # checkpoints: periodic ones during training and one final
        kinds = [e["payload"]["kind"] for e in await outbox(p["trainer-agent"], "checkpoint.written")]
        assert kinds.count("final") == 1 and kinds.count("periodic") >= 1

        # metering: one segment line and one job total, published once each
        assert len(usage["lines"]) == 1 and usage["total"]["gpu_seconds"] > 0
        assert usage["total"]["charge_class"] == "charged"
        metered = [e["payload"]["scope"] for e in await outbox(p["metering"], "usage.metered")]
        assert sorted(metered) == ["job", "segment"]

        # the job's events tell its story
        async with httpx.AsyncClient(base_url=p.url("scheduler")) as c:
            events = (await c.get(f"/v1/fine_tuning/jobs/{job['id']}/events", params={"limit": 500},
                                  auth=IdentityAuth("demo"))).json()["data"]
            messages = " | ".join(e["message"] for e in events)
            for expected in ("job created", "job queued", "assigned to", "training started",
                             "final checkpoint", "evaluation passed"):
                assert expected in messages, messages
            # another tenant cannot see it
            r = await c.get(f"/v1/fine_tuning/jobs/{job['id']}", auth=IdentityAuth("acme"))
            assert r.status_code == 404
