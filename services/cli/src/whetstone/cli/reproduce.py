"""`whet jobs reproduce JOB`: the create body that trains JOB again with everything pinned. Pure.

Pinned: the same files (their ids: a file's content never changes under its id), the base model by
the sha256 / Hub commit admission recorded (`base_model_sha256`: a catalog base that changed since is
refused, a Hub base trains on that commit), every hyperparameter as admission resolved it ("auto"
no longer: the same numbers, the seed included), the method, the eval settings and the suffix.
The new job's metadata names the job it reproduces. A job never admitted has nothing to pin."""

from __future__ import annotations

from typing import Any

from whetstone.contracts import Hyperparameters

from .errors import BadInput

METADATA_LIMIT = 16   # OpenAI's: pairs per job


def reproduce_body(job: dict[str, Any]) -> dict[str, Any]:
    job_id = job.get("id")
    resolved = job.get("resolved_hyperparameters")
    if not resolved or not job.get("base_model_sha256"):
        raise BadInput(f"job {job_id} was never admitted (state {job.get('state')!r}): it has no resolved "
                       "hyperparameters or pinned base model to reproduce")
    method = job.get("method") or {}
    family = method.get("type")
    if family not in ("supervised", "dpo"):
        raise BadInput(f"job {job_id}: reproduce covers supervised and dpo jobs, not method {family!r}")
    platform = (method.get("whetstone") or {}).get("method")
    # the knobs the API takes, as admission resolved them (gradient checkpointing and the batch geometry included)
    hp = {k: v for k, v in resolved.items() if k in Hyperparameters.model_fields and v is not None}
    spec: dict[str, Any] = {"type": family, family: {"hyperparameters": hp}}
    if platform:
        spec["whetstone"] = {"method": platform}
    metadata = dict(job.get("metadata") or {})
    metadata["reproduces"] = str(job_id)
    if len(metadata) > METADATA_LIMIT:
        raise BadInput(f"job {job_id} has {len(metadata) - 1} metadata pairs: no room for 'reproduces' "
                       f"(at most {METADATA_LIMIT})")
    body: dict[str, Any] = {"model": job["model"], "training_file": job["training_file"], "method": spec,
                            "base_model_sha256": job["base_model_sha256"], "metadata": metadata}
    optional = {"validation_file": job.get("validation_file"), "suffix": job.get("user_provided_suffix"),
                "eval_config": job.get("eval_config"), "tier": job.get("tier"),
                "integrations": job.get("integrations") or None}
    body.update({k: v for k, v in optional.items() if v is not None})
    return body
