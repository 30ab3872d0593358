"""Merged full weights on request (issue 17, point 4): POST /v1/models/{id}/merged becomes a merge job
of the model's tenant through the scheduler's queue, run by the trainer agent (verified adapter
download, merge_and_unload, safetensors uploaded with a per-file sha256 manifest), answered to the
registry, cached, and billed by metering like any job. Registry, scheduler, trainer agent and
metering on the real embedded stack; a real LoRA adapter on the tiny Llama."""

from __future__ import annotations

import hashlib
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from whetstone.contracts import (
    CheckpointRef,
    CheckpointWrittenV1,
    EvalCompletedV1,
    JobCancelledV1,
    JobQueuedV1,
    MergeRequestedV1,
    MergeSource,
    Metric,
    ModelMergedV1,
    Resources,
    TrainingSpec,
    job_id_for,
)
from whetstone.devstack.testing import outbox, send_event, wait_until
from whetstone.metering.bootstrap import build_service as build_metering
from whetstone.modelkit.tiny import build_tiny_model
from whetstone.registry.bootstrap import build_service as build_registry
from whetstone.registry.domain.stages import model_id_for
from whetstone.runtime.checkpoints import upload_checkpoint
from whetstone.runtime.identity import IdentityAuth
from whetstone.runtime.models import resolve_model
from whetstone.scheduler.bootstrap import build_service as build_scheduler
from whetstone.scheduler.domain.job import new_job
from whetstone.scheduler.domain.job_data import JobRequest, JobResources, MemoryGb, PlacedPart, QuotaRecord
from whetstone.scheduler.domain.placement import Shape
from whetstone.trainer_agent.bootstrap import build_service as build_agent
from whetstone.trainer_agent.config import TrainerAgentSettings
from whetstone.trainer_agent.recipes.errors import PlatformError
from whetstone.trainer_agent.recipes.merge import check_output

TENANT = "demo"


def lora_adapter(base: Path, out: Path) -> None:
    """A LoRA adapter as training leaves it (safetensors + config + tokenizer), with random non-zero
    B matrices so that merging really changes the weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False, task_type="CAUSAL_LM"))
    peft.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)


def logits(model_dir: Path, adapter: Path | None = None):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 42, 77, 300, 1000, 7]])).logits


async def register(p, job_id: str, adapter: Path, base_sha: str) -> str:
    """The three facts that make a registered model (job.queued, final checkpoint, eval verdict) for an
    adapter uploaded as the trainer uploads a final checkpoint."""
    store, bootstrap = p["registry"].store, p.settings.kafka_bootstrap
    up = upload_checkpoint(store, adapter, f"tenants/{TENANT}/jobs/{job_id}/checkpoints/final",
                           {"job_id": job_id, "tenant_id": TENANT})
    spec = TrainingSpec(base_model="tiny-llama", base_model_sha256=base_sha, dataset_id="ds-1", dataset_version="b" * 64,
                        train_uri=f"s3://whetstone/tenants/{TENANT}/datasets/ds-1/train.jsonl", method="lora",
                        hyperparameters={"n_epochs": 1}, hyperparameters_hash="c" * 64)
    await send_event(bootstrap, EvalCompletedV1(job_id=job_id, checkpoint_uri=up.uri, verdict="passed",
                                                reasons=["eval passed"],
                                                metrics=[Metric(name="holdout_loss", base=2.0, candidate=1.9)]), TENANT)
    await send_event(bootstrap, CheckpointWrittenV1(job_id=job_id, segment_id=f"{job_id}-s1", checkpoint_id="c",
                                                    kind="final", step=5, uri=up.uri, manifest_sha256=up.manifest_sha256,
                                                    files=up.files, size_bytes=up.size_bytes,
                                                    written_at=datetime.now(UTC)), TENANT)
    await send_event(bootstrap, JobQueuedV1(job_id=job_id, tier="standard", spec=spec,
                                            resources=Resources(gpu_type="cpu", gpus_per_node=1)), TENANT)
    model_id = model_id_for(job_id)

    async def landed():
        return await p["registry"].pool.fetchval("SELECT 1 FROM models WHERE model_id = $1", model_id)
    await wait_until(landed, 30, f"{model_id} registered")
    return model_id


@pytest.mark.integration
async def test_merged_weights_through_the_queue_cached_billed_and_failing_on_a_corrupt_adapter(platform, settings,
                                                                                               tmp_path):
    base = build_tiny_model(Path(settings.model_catalog) / "tiny-llama")
    sha = resolve_model("tiny-llama", settings.model_catalog).sha256
    adapter = tmp_path / "adapter"
    lora_adapter(base, adapter)
    expected = logits(base, adapter)        # the in-process merge_and_unload of the same adapter
    assert not (expected - logits(base)).abs().max() < 1e-4, "the adapter must change the model"
    agent = TrainerAgentSettings(node_id="node-merge", heartbeat_s=0.3, progress_interval_s=0.2)
    signed = IdentityAuth(TENANT, ("read", "write"))   # each request signed with this stack's secret

    async with platform(build_registry, build_scheduler, lambda: build_agent(agent), build_metering) as p:
        good = await register(p, "ftjob-merge-good", adapter, sha)
        bad = await register(p, "ftjob-merge-bad", adapter, sha)
        # someone alters the second adapter in S3 after registration: its pinned manifest no longer matches
        p["registry"].store.put_bytes(f"tenants/{TENANT}/jobs/ftjob-merge-bad/checkpoints/final/"
                                      "adapter_model.safetensors", b"not the adapter")

        async with httpx.AsyncClient(base_url=p.url("registry"), timeout=30) as reg:
            first = (await reg.post(f"/v1/models/{good}/merged", auth=signed)).json()
            assert first.get("status") == "requested", first
            assert (await reg.post(f"/v1/models/{bad}/merged", auth=signed)).json()["status"] == "requested"

            async def answered(model_id: str):
                view = (await reg.get(f"/v1/models/{model_id}/merged", auth=signed)).json()
                return view if view["status"] != "requested" else None

            done = await wait_until(lambda: answered(good), 180, "merge succeeded")  # a child process importing torch
            assert done["status"] == "succeeded", done
            merge_job = job_id_for(TENANT, first["id"])
            assert done["merge_job_id"] == merge_job

            # cached: a second request answers the same merge, no second command, no second job
            again = (await reg.post(f"/v1/models/{good}/merged", auth=signed)).json()
            assert again["id"] == done["id"] and again["status"] == "succeeded" and again["merge_job_id"] == merge_job
            commands = [e for e in await outbox(p["registry"], "model.merge_requested")
                        if e["payload"]["model_id"] == good]
            assert len(commands) == 1
            # a redelivered command (new event id, same merge) finds the job it made
            await send_event(p.settings.kafka_bootstrap, MergeRequestedV1.model_validate(commands[0]["payload"]), TENANT)
            # a command for another tenant's adapter is refused with the reason
            await send_event(p.settings.kafka_bootstrap, MergeRequestedV1.model_validate(
                {**commands[0]["payload"], "merge_id": "merge-stolen"}), "acme")
            letters = await wait_until(lambda: outbox(p["scheduler"], "model.merge_requested.dlq"), 30, "dead letter")
            assert "tenant_mismatch" in letters[0]["payload"]["error"]
            assert await p["scheduler"].pool.fetchval("SELECT count(*) FROM jobs WHERE request->>'method' = 'merge'"
                                                      " AND tenant_id = $1", TENANT) == 2

            # the merged weights: safetensors + config + tokenizer, each as its manifest says
            names = {f["name"] for f in done["files"]}
            assert "config.json" in names and any(n.endswith(".safetensors") for n in names), names
            assert all(n.endswith((".safetensors", ".json", ".jinja", ".txt", ".md")) for n in names), names
            with tempfile.TemporaryDirectory() as tmp:
                async with httpx.AsyncClient(timeout=30) as anon:   # presigned: no identity needed
                    for f in done["files"]:
                        data = (await anon.get(f["url"])).content
                        assert hashlib.sha256(data).hexdigest() == f["sha256"], f["name"]
                        (Path(tmp) / f["name"]).parent.mkdir(parents=True, exist_ok=True)
                        (Path(tmp) / f["name"]).write_bytes(data)
                import torch
                merged = logits(Path(tmp))
                assert torch.allclose(merged, expected, atol=1e-5), (merged - expected).abs().max()

            # the corrupt adapter: the merge job fails with a named class, the registry shows why
            failed = await wait_until(lambda: answered(bad), 60, "merge failed")
            assert failed["status"] == "failed" and "adapter_corrupted" in failed["error"], failed
            assert "does not match its sha256" in failed["error"] and failed["files"] == []
            # asked again after the failure: a new merge under a new id (so a new job), not the failed answer
            retried = (await reg.post(f"/v1/models/{bad}/merged", auth=signed)).json()
            assert retried["status"] == "requested" and retried["id"] == f"merge-{bad}~2", retried
            commands = [e["payload"]["merge_id"] for e in await outbox(p["registry"], "model.merge_requested")
                        if e["payload"]["model_id"] == bad]
            assert sorted(commands) == [f"merge-{bad}", f"merge-{bad}~2"]

        async with httpx.AsyncClient(base_url=p.url("scheduler"), timeout=30) as sch:
            job = (await sch.get(f"/v1/fine_tuning/jobs/{merge_job}", auth=signed)).json()
            assert job["status"] == "succeeded" and job["method"]["whetstone"]["method"] == "merge", job
            bad_job = (await sch.get(f"/v1/fine_tuning/jobs/{failed['merge_job_id']}", auth=signed)).json()
            assert bad_job["status"] == "failed" and bad_job["error"]["code"] == "adapter_corrupted", bad_job
            assert bad_job["error"]["error_class"] == "platform"

        # billed as a job: metering settles the merge job's segment into usage.metered
        async def billed():
            return [e["payload"] for e in await outbox(p["metering"], "usage.metered")
                    if e["payload"]["job_id"] == merge_job and e["payload"]["scope"] == "segment"]
        usage = await wait_until(billed, 30, "usage.metered for the merge job")
        assert len(usage) == 1 and usage[0]["gpu_seconds"] > 0 and usage[0]["charge_class"] == "charged", usage


# ----------------------------------------------------------------------------- pure parts


def merge_job(merge_id: str):
    source = MergeSource(merge_id=merge_id, model_id="wsm-1", adapter_uri="s3://w/tenants/demo/jobs/j/checkpoints/final",
                         adapter_manifest_sha256="a" * 64, source_job_id="j")
    request = JobRequest(job_id="ftjob-m", idempotency_key=merge_id, model="m", training_file="wsm-1", method="merge",
                         merge=source)
    now = datetime(2026, 11, 23, tzinfo=UTC)
    job = new_job("ftjob-m", TENANT, "fp", request, "standard", "m", "b" * 64,
                  JobResources(shapes=(Shape("cpu", 1, 1),), memory_gb=MemoryGb(total=1.0)), now, "trace")
    spec = TrainingSpec(base_model="m", base_model_sha256="b" * 64, dataset_id="wsm-1", dataset_version="a" * 64,
                        train_uri=source.adapter_uri, method="merge", hyperparameters={}, hyperparameters_hash="h",
                        merge=source)
    job.queue(now, spec, 0.0, 60.0, QuotaRecord(), 0, {})
    return job, now


@pytest.mark.unit
def test_a_merge_job_succeeds_without_evaluation_and_a_cancel_answers_the_merge():
    job, now = merge_job("merge-1")
    job.assign(now, [PlacedPart(node_id="n", gpu_ids=[0])], Shape("cpu", 1), False, False, 60.0, {})
    job.started(now, "n", now, 1, None)
    assert job.training_completed(now, 1, None, CheckpointRef(uri="s3://w/m", step=1, manifest_sha256="c" * 64))
    assert job.status == "succeeded" and job.eval is None

    other, now = merge_job("merge-2")
    events = other.cancel(now)
    assert [type(e) for e in events] == [JobCancelledV1, ModelMergedV1]
    assert events[1].status == "failed" and events[1].merge_id == "merge-2" and "cancelled" in events[1].error


@pytest.mark.unit
def test_merged_output_with_a_pickle_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "config.json").write_text("{}")
    assert check_output(tmp_path) == ["config.json", "model.safetensors"]
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(PlatformError, match="pytorch_model.bin"):
        check_output(tmp_path)
