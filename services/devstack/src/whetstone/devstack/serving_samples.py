"""Sample adapters for serving's tests and `bench/serving.py`: random LoRA adapters on a base, stored
like the trainer stores a final checkpoint (files + sha256 manifest in S3), and the registry events
that announce them. No training, real PEFT files."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from whetstone.contracts import Lineage, ModelPromotedV1, ModelRegisteredV1
from whetstone.runtime.checkpoints import upload_checkpoint
from whetstone.runtime.s3 import ObjectStore, sha256_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def make_adapter(base_dir: Path, out_dir: Path, *, seed: int, r: int = 8, with_tokenizer: bool = True) -> Path:
    """A PEFT LoRA with random (non-zero) A and B, saved with the base's tokenizer and chat template."""
    import torch
    from peft import LoraConfig, get_peft_model

    from whetstone.modelkit.loading import load_model, load_tokenizer

    base = load_model(base_dir, dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(TARGETS),
                                                init_lora_weights=False))
    model.save_pretrained(str(out_dir))
    if with_tokenizer:
        load_tokenizer(base_dir).save_pretrained(str(out_dir))
    return out_dir


@dataclass(frozen=True)
class StoredAdapter:
    model_id: str
    name: str
    uri: str
    manifest_sha256: str
    files: dict[str, str]
    chat_template_sha256: str | None


def store_adapter(store: ObjectStore, local: Path, tenant_id: str, model_id: str, name: str) -> StoredAdapter:
    prefix = f"tenants/{tenant_id}/models/{model_id}/artifact"
    up = upload_checkpoint(store, local, prefix, {"model_id": model_id, "tenant_id": tenant_id, "kind": "final"})
    files = {p.relative_to(local).as_posix(): sha256_file(p) for p in sorted(local.rglob("*")) if p.is_file()}
    template = local / "chat_template.jinja"
    template_sha = hashlib.sha256(template.read_text().encode()).hexdigest() if template.exists() else None
    return StoredAdapter(model_id, name, up.uri, up.manifest_sha256, files, template_sha)


def registered(a: StoredAdapter, *, base_model: str, base_sha256: str, stage: str = "dev",
               fine_tuned_model: str | None = None) -> ModelRegisteredV1:
    lineage = Lineage(job_id=f"job-{a.model_id}", base_model=base_model, base_model_sha256=base_sha256,
                      dataset_id="ds-sample", dataset_version="0" * 64, method="lora", hyperparameters_hash="0" * 64,
                      chat_template_sha256=a.chat_template_sha256)
    return ModelRegisteredV1(model_id=a.model_id, name=a.name, stage=stage, fine_tuned_model=fine_tuned_model,
                             artifact_uri=a.uri,
                             artifact_sha256=a.manifest_sha256, lineage=lineage, files=a.files)


def promoted(a: StoredAdapter, from_stage: str, to_stage: str, *, base_model: str, base_sha256: str,
             sequence: int | None = None) -> ModelPromotedV1:
    return ModelPromotedV1(model_id=a.model_id, from_stage=from_stage, to_stage=to_stage, reason="sample",
                           name=a.name, artifact_uri=a.uri, artifact_sha256=a.manifest_sha256, files=a.files,
                           base_model=base_model, base_model_sha256=base_sha256,
                           chat_template_sha256=a.chat_template_sha256, sequence=sequence)
