"""What the models API answers about a fine-tuned version: OpenAI's model object with the registry's
extensions (stage, artifact, and in a detail the lineage and stage history)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from whetstone.contracts.enums import Approval, ModelStage

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
