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
from whetstone.contracts import TOLERANT, Hyperparameters
from whetstone.contracts.integrations import Integration

from .errors import BadInput
from .job_request import CreateJob, Family, PlatformName, checked_body, method_spec

METADATA_LIMIT = 16   # OpenAI's: pairs per job
FAMILIES: dict[str, Family] = {"supervised": "supervised", "dpo": "dpo"}   # the methods reproduce covers


class _Extension(BaseModel):
    """The platform's extension of OpenAI's method object."""
    model_config = ConfigDict(extra="ignore")
    method: PlatformName | None = None       # the platform's own method name (lora, qlora, full, cpt, orpo, ...)


class _Method(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str | None = None
    whetstone: _Extension | None = None


class JobAnswer(BaseModel):
    """The fields of the API's job object that a reproduction pins (the rest is ignored). The resolved
    hyperparameters are read as the contract's knobs: the platform's other resolved figures are left out."""
    model_config = ConfigDict(extra="ignore")
    id: str
    state: str | None = None
    model: str
    training_file: str
    validation_file: str | None = None
    user_provided_suffix: str | None = None
    method: _Method = _Method()
    resolved_hyperparameters: Hyperparameters | None = None
    base_model_sha256: str | None = None
    metadata: dict[str, str] | None = None
    eval_config: dict[str, Any] | None = None
    tier: str | None = None
    integrations: list[Integration] | None = None
    image: str | None = None

    @classmethod
    def from_api(cls, answer: object) -> JobAnswer:
        with checked_body():
            return cls.model_validate(answer, context=TOLERANT)


def reproduce_body(job: JobAnswer) -> CreateJob:
    # the knobs the API takes, as admission resolved them (gradient checkpointing and the batch geometry included)
    resolved = job.resolved_hyperparameters
    hp = resolved.model_dump(mode="json", exclude_none=True) if resolved is not None else {}
    if not hp or not job.base_model_sha256:
        raise BadInput(f"job {job.id} was never admitted (state {job.state!r}): it has no resolved "
                       "hyperparameters or pinned base model to reproduce")
    family = FAMILIES.get(job.method.type or "")
    if family is None:
        raise BadInput(f"job {job.id}: reproduce covers supervised and dpo jobs, not method {job.method.type!r}")
    platform = job.method.whetstone.method if job.method.whetstone else None
    metadata = {**(job.metadata or {}), "reproduces": job.id}
    if len(metadata) > METADATA_LIMIT:
        raise BadInput(f"job {job.id} has {len(metadata) - 1} metadata pairs: no room for 'reproduces' "
                       f"(at most {METADATA_LIMIT})")
    integrations = [i.model_dump(mode="json", exclude_none=True) for i in job.integrations or []]
    with checked_body():
        return CreateJob(model=job.model, training_file=job.training_file, method=method_spec(family, platform, hp),
                         base_model_sha256=job.base_model_sha256, metadata=metadata,
                         validation_file=job.validation_file, suffix=job.user_provided_suffix,
                         eval_config=job.eval_config, tier=job.tier, integrations=integrations or None, image=job.image)
