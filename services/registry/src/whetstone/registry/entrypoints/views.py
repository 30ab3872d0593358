"""What the registry's API answers: a fine-tuned version as OpenAI's model object with the registry's
extensions (stage, artifact, and in a detail the lineage and stage history), and the base models of the
catalog with their pinned versions. Times are ISO 8601 strings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from whetstone.contracts.enums import Approval, ModelStage

from ..domain.drift import FIRST_PIN_ACTOR, BaseModelEntry, BaseVersion
from ..domain.lineage import LineageView, StoredLineage
from ..domain.stages import ModelRecord, StageChange


class StageChangeView(BaseModel):
    """One row of a version's stage history, its time in ISO 8601."""

    model_config = ConfigDict(frozen=True)

    id: int
    from_stage: ModelStage | None
    to_stage: ModelStage
    reason: str
    approval: Approval | None
    actor: str | None
    replaces_model_id: str | None
    at: str

    @classmethod
    def of(cls, change: StageChange) -> StageChangeView:
        return cls(id=change.id, from_stage=change.from_stage, to_stage=change.to_stage, reason=change.reason,
                   approval=change.approval, actor=change.actor, replaces_model_id=change.replaces_model_id,
                   at=change.at.isoformat())


class NoLineage(BaseModel):
    """The `lineage` of a version the registry holds none for: an empty object."""


DETAIL_FIELDS = frozenset({"lineage", "stage_history"})


class ModelView(BaseModel):
    """A fine-tuned version in `/v1/models`; `lineage` and `stage_history` only in a detail (None
    otherwise, and left out of a list's summaries)."""

    model_config = ConfigDict(frozen=True)

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    model_id: str
    fine_tuned_model: str | None
    model_type: Literal["fine_tuned"]
    name: str
    stage: ModelStage
    needs_reeval: bool
    job_id: str
    artifact_uri: str
    artifact_sha256: str
    lineage: LineageView | NoLineage | None = None
    stage_history: list[StageChangeView] | None = None

    @model_serializer(mode="wrap")
    def _summary(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """A summary (no detail was given) is written without the detail's fields."""
        fields: dict[str, object] = handler(self)
        if self.lineage is None:
            for name in DETAIL_FIELDS:
                fields.pop(name, None)
        return fields

    @classmethod
    def of(cls, m: ModelRecord, detail: tuple[StoredLineage | None, list[StageChange]] | None = None) -> ModelView:
        """The version's view; with `detail` (its stored lineage and stage history) its full view."""
        summary = cls(id=m.public_id, object="model", created=int(m.created_at.timestamp()), owned_by=m.tenant_id,
                      model_id=m.model_id, fine_tuned_model=m.fine_tuned_model, model_type="fine_tuned",
                      name=m.name, stage=m.stage, needs_reeval=m.needs_reeval, job_id=m.job_id,
                      artifact_uri=m.artifact_uri, artifact_sha256=m.artifact_sha256)
        if detail is None:
            return summary
        lineage, history = detail
        return summary.model_copy(update={"lineage": lineage.view() if lineage else NoLineage(),
                                          "stage_history": [StageChangeView.of(h) for h in history]})


class BaseModelView(BaseModel):
    """A base model of the catalog at its current pinned sha256 (`/v1/base_models`)."""

    model_config = ConfigDict(frozen=True)

    id: str
    object: Literal["base_model"] = "base_model"
    name: str
    sha256: str
    previous_sha256: str | None
    uri: str | None
    updated_at: str

    @classmethod
    def of(cls, entry: BaseModelEntry) -> BaseModelView:
        return cls(id=entry.name, name=entry.name, sha256=entry.sha256, previous_sha256=entry.previous_sha256,
                   uri=entry.uri, updated_at=entry.updated_at.isoformat())


class BaseVersionView(BaseModel):
    """One published sha256 of a base model."""

    model_config = ConfigDict(frozen=True)

    sha256: str
    previous_sha256: str | None
    uri: str | None
    reason: str
    actor: str
    at: str

    @classmethod
    def of(cls, version: BaseVersion, *, operator: bool) -> BaseVersionView:
        """The version; its first pin names a tenant's job in `reason`, which only the operator sees."""
        reason = version.reason
        if version.actor == FIRST_PIN_ACTOR and not operator:
            reason = "first pinned by a fine-tuning job"
        return cls(sha256=version.sha256, previous_sha256=version.previous_sha256, uri=version.uri, reason=reason,
                   actor=version.actor, at=version.at.isoformat())


class BaseModelVersions(BaseModelView):
    """A base model with every version published for it, oldest first."""

    versions: list[BaseVersionView]
