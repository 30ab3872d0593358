"""Helpers for the registry's integration tests: a real artifact in S3 and the three events
(job.queued, checkpoint.written final, eval.completed) that make a model."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from whetstone.contracts import CheckpointWrittenV1, EvalCompletedV1, JobQueuedV1, Metric, Resources, TrainingSpec
from whetstone.devstack.testing import send_event, wait_until
from whetstone.registry.domain.stages import model_id_for
from whetstone.runtime.checkpoints import upload_checkpoint
from whetstone.runtime.identity import IdentityAuth

BASE = "tiny-llama"
BASE_SHA = "a" * 64
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


def auth(tenant: str = "demo", *scopes: str) -> IdentityAuth:
    """Each request signed as the gateway signs it for `tenant` with `scopes` (default read + write)."""
    return IdentityAuth(tenant, scopes or ("read", "write"))


def upload_artifact(store, tenant: str, job_id: str, extra: dict[str, bytes] | None = None,
                    name: str = "final") -> tuple[str, str]:
    """A final checkpoint as the trainer writes it: a safetensors LoRA adapter, PEFT's config
    (with the local training path), tokenizer files with the chat template; manifest last."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        save_file({"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": np.ones((4, 16), np.float32),
                   "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((16, 4), np.float32)},
                  str(d / "adapter_model.safetensors"))
        (d / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
            "base_model_name_or_path": "/tmp/whetstone/models/tiny-llama", "task_type": "CAUSAL_LM"}))
        (d / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
        (d / "README.md").write_text("---\nlibrary_name: peft\n---\n")  # PEFT writes one: it stays as listed
        for rel, data in (extra or {}).items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(data)
        up = upload_checkpoint(store, d, f"tenants/{tenant}/jobs/{job_id}/checkpoints/{name}",
                               {"job_id": job_id, "tenant_id": tenant})
    return up.uri, up.manifest_sha256


async def register(p, job_id: str, tenant: str = "demo", *, suffix: str | None = "support", verdict: str = "passed",
                   metrics: list[Metric] | None = None, base_sha: str = BASE_SHA, times: int = 1,
                   extra: dict[str, bytes] | None = None, stage: str | None = None, eval_last: bool = False) -> str:
    """A model registered through the events; `eval_last`: the verdict is read after the job and its final
    checkpoint, so the registration happens in the eval.completed handler."""
    rt, b = p["registry"], p.settings.kafka_bootstrap
    uri, digest = upload_artifact(rt.store, tenant, job_id, extra)
    spec = TrainingSpec(base_model=BASE, base_model_sha256=base_sha, dataset_id="ds-1", dataset_version="b" * 64,
                        train_uri="s3://whetstone/x", method="lora", hyperparameters={"n_epochs": 1},
                        hyperparameters_hash="c" * 64)
    queued = JobQueuedV1(job_id=job_id, tier="standard", spec=spec, resources=Resources(gpu_type="cpu", gpus_per_node=1))
    payload = {**queued.model_dump(mode="json"), **({"suffix": suffix} if suffix else {})}
    metrics = metrics or [Metric(name="holdout_loss", base=2.0, candidate=1.9)]
    evaluated = EvalCompletedV1(job_id=job_id, checkpoint_uri=uri, verdict=verdict, reasons=[f"eval {verdict}"],
                                metrics=metrics)
    if not eval_last:
        await send_event(b, evaluated, tenant, times=times)
    await send_event(b, CheckpointWrittenV1(job_id=job_id, segment_id=f"{job_id}-s1", checkpoint_id="c", kind="final",
                                            step=5, uri=uri, manifest_sha256=digest, files=4, size_bytes=1,
                                            written_at=datetime.now(UTC)), tenant, times=times)
    await send_event(b, queued, tenant, times=times, payload=payload)
    if eval_last:
        async def read():
            return await rt.pool.fetchval("SELECT count(*) FROM final_checkpoints f JOIN jobs j USING (job_id)"
                                          " WHERE job_id = $1", job_id)
        await wait_until(read, 30, f"{job_id}'s job and final checkpoint read")
        await send_event(b, evaluated, tenant, times=times)
    model_id = model_id_for(job_id)
    target = stage or ("staging" if verdict == "passed" else "quarantined")

    async def landed():
        return await rt.pool.fetchval("SELECT stage = $2 FROM models WHERE model_id = $1", model_id, target)
    await wait_until(landed, 30, f"{model_id} registered")
    return model_id


@pytest.fixture
def kit():
    """This module's helpers (test modules cannot import a conftest under --import-mode=importlib)."""
    import sys

    return sys.modules[__name__]
