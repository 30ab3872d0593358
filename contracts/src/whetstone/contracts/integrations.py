"""A job's experiment-tracking integrations (a job create's `integrations`), as the job events carry them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, field_validator, model_validator

from .base import Contract
from .enums import IntegrationType

TagText = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class WandbIntegration(Contract):
    """OpenAI's `integrations[i].wandb`: the W&B project of the job's run, and optionally its entity, display
    name (absent: the job id) and tags. The platform writes the run OFFLINE (it stores no W&B key): ingest
    makes it a result file of the job, `<job>-wandb-offline.tar.gz`, for the tenant to `wandb sync`."""

    project: str = Field(min_length=1, max_length=128)
    entity: str | None = Field(default=None, max_length=128)
    name: str | None = Field(default=None, max_length=128)
    tags: list[TagText] = Field(default_factory=list, max_length=50)

    @field_validator("tags", mode="before")
    @classmethod
    def _null_tags(cls, value: object) -> object:
        return [] if value is None else value   # OpenAI's schema lets a client send `"tags": null`


class MlflowIntegration(Contract):
    """The platform's `integrations[i].mlflow`: which experiment of the OPERATOR's tracking server the job's
    run goes to (the server is the operator's setting, never a tenant's URL). The experiment is created
    under the tenant's name, `<tenant>/<experiment_name>`, so tenants sharing the server never meet."""

    experiment_name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9 _.\-/]+$")
    run_name: str | None = Field(default=None, min_length=1, max_length=200, description="absent: the job id")


class Integration(Contract):
    """One `integrations[i]`: its type and the block of that name (only that one)."""

    type: IntegrationType
    wandb: WandbIntegration | None = None
    mlflow: MlflowIntegration | None = None

    @model_validator(mode="after")
    def _block_of_its_type(self) -> Integration:
        given = {kind for kind in IntegrationType if getattr(self, kind.value) is not None}
        if given != {self.type}:
            raise ValueError(f"an integration of type {self.type.value!r} carries exactly its own block "
                             f"{self.type.value!r}")
        return self
