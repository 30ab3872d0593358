"""`whet jobs reproduce JOB`: the create body that trains JOB again with everything pinned. Pure.

Pinned: the same files (their ids: a file's content never changes under its id), the base model by
the sha256 / Hub commit admission recorded (`base_model_sha256`: a catalog base that changed since is
refused, a Hub base trains on that commit), every hyperparameter as admission resolved it ("auto"
no longer: the same numbers, the seed included), the method, the eval settings, the suffix and the
trainer image the job was pinned to (`image`, a template's digest pin).
The new job's metadata names the job it reproduces. A job never admitted has nothing to pin."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from whetstone.contracts import Hyperparameters

from .errors import BadInput

METADATA_LIMIT = 16   # OpenAI's: pairs per job


class _Extension(BaseModel):
    """The platform's extension of OpenAI's method object."""
    model_config = ConfigDict(extra="ignore")
    method: str | None = None       # the platform's own method name (lora, qlora, full, cpt, orpo, ...)


class _Method(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str | None = None
    whetstone: _Extension | None = None


class _JobAnswer(BaseModel):
    """The fields of the API's job object that a reproduction pins (the rest is ignored)."""
    model_config = ConfigDict(extra="ignore")
    id: str
    state: str | None = None
    model: str
    training_file: str
    validation_file: str | None = None
    user_provided_suffix: str | None = None
    method: _Method = _Method()
    resolved_hyperparameters: dict[str, Any] | None = None
    base_model_sha256: str | None = None
    metadata: dict[str, str] | None = None
    eval_config: dict[str, Any] | None = None
    tier: str | None = None
    integrations: list[dict[str, Any]] | None = None
    image: str | None = None


def reproduce_body(answer: dict[str, Any]) -> dict[str, Any]:
    job = _JobAnswer.model_validate(answer)
    resolved = job.resolved_hyperparameters
    if not resolved or not job.base_model_sha256:
        raise BadInput(f"job {job.id} was never admitted (state {job.state!r}): it has no resolved "
                       "hyperparameters or pinned base model to reproduce")
    family = job.method.type
    if family not in ("supervised", "dpo"):
        raise BadInput(f"job {job.id}: reproduce covers supervised and dpo jobs, not method {family!r}")
    platform = job.method.whetstone.method if job.method.whetstone else None
    # the knobs the API takes, as admission resolved them (gradient checkpointing and the batch geometry included)
    hp = {k: v for k, v in resolved.items() if k in Hyperparameters.model_fields and v is not None}
    spec: dict[str, Any] = {"type": family, family: {"hyperparameters": hp}}
    if platform:
        spec["whetstone"] = {"method": platform}
    metadata = {**(job.metadata or {}), "reproduces": job.id}
    if len(metadata) > METADATA_LIMIT:
        raise BadInput(f"job {job.id} has {len(metadata) - 1} metadata pairs: no room for 'reproduces' "
                       f"(at most {METADATA_LIMIT})")
    body: dict[str, Any] = {"model": job.model, "training_file": job.training_file, "method": spec,
                            "base_model_sha256": job.base_model_sha256, "metadata": metadata}
    optional = {"validation_file": job.validation_file, "suffix": job.user_provided_suffix,
                "eval_config": job.eval_config, "tier": job.tier, "integrations": job.integrations or None, "image": job.image}
    body.update({k: v for k, v in optional.items() if v is not None})
    return body
