"""Model stages, identity and the rules of every stage transition. Pure: no IO.

dev -> staging -> production -> archived, and quarantined (never promotable). At most one
production version per (tenant, name): promoting one archives the version it replaces.
Production needs an approval: a caller allowed to approve (`manual`) or the auto-promotion
policy (`auto`). Rollback puts the previous production version of the same name back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from pydantic.dataclasses import dataclass as record

from whetstone.contracts import Lineage
from whetstone.contracts.enums import Approval, EvalVerdict, ModelStage

STAGES = tuple(ModelStage)
S = ModelStage
# target stages reachable by an ordinary promotion (rollback and replacement are separate rules)
PROMOTIONS: dict[ModelStage, frozenset[ModelStage]] = {
    S.DEV: frozenset({S.STAGING, S.QUARANTINED, S.ARCHIVED}),
    S.STAGING: frozenset({S.PRODUCTION, S.QUARANTINED, S.ARCHIVED}),
    S.PRODUCTION: frozenset({S.ARCHIVED}),
    S.QUARANTINED: frozenset({S.ARCHIVED}),
    S.ARCHIVED: frozenset(),
}


class TransitionRefused(Exception):
    """A transition the rules forbid; `code` names why (an API error code)."""

    def __init__(self, code: str, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


@record(frozen=True)
class ModelRecord:
    model_id: str
    job_id: str
    tenant_id: str
    name: str
    stage: ModelStage
    artifact_uri: str
    artifact_sha256: str
    created_at: datetime
    needs_reeval: bool = False
    lineage: Lineage | None = None   # as announced in model.registered
    files: dict[str, str] = field(default_factory=dict)
    fine_tuned_model: str | None = None   # the public id (OpenAI's); None for versions registered before it

    @property
    def public_id(self) -> str:
        return self.fine_tuned_model or self.model_id


@dataclass(frozen=True)
class Transition:
    model_id: str
    from_stage: ModelStage | None   # None: the registration itself
    to_stage: ModelStage
    reason: str
    approval: Approval | None = None
    replaces_model_id: str | None = None


@record(frozen=True)
class StageChange:
    """One row of a model's stage history (append-only)."""

    id: int
    from_stage: ModelStage | None
    to_stage: ModelStage
    reason: str
    approval: Approval | None
    actor: str | None
    replaces_model_id: str | None
    at: datetime


@dataclass(frozen=True)
class Plan:
    """The transitions of one request, applied in one transaction, in this order."""

    transitions: tuple[Transition, ...]

    @property
    def main(self) -> Transition:
        return self.transitions[-1]


def model_id_for(job_id: str) -> str:
    return "wsm-" + hashlib.sha256(job_id.encode()).hexdigest()[:20]


def model_name(base_model: str, tenant_id: str, job_id: str, suffix: str | None = None) -> str:
    """The name a tenant calls: versions of one name share the job's suffix; without a suffix
    each job is its own name (OpenAI's `ft:<base>:<org>:<suffix>:<id>`)."""
    base = base_model.rstrip("/").rsplit("/", 1)[-1]
    return f"ft:{base}:{tenant_id}:{suffix}" if suffix else f"ft:{base}:{tenant_id}:{job_id[-8:]}"


def stage_after_eval(verdict: str) -> ModelStage:
    """Passed -> staging (serving handoff); failed -> quarantined, never promoted."""
    return S.STAGING if verdict == EvalVerdict.PASSED else S.QUARANTINED


def can_promote(current: ModelStage, target: ModelStage) -> bool:
    return target in PROMOTIONS[current]


def parse_stage(value: str) -> ModelStage:
    try:
        return ModelStage(value)
    except ValueError:
        raise TransitionRefused("invalid_stage", f"unknown stage {value!r}; one of {', '.join(STAGES)}",
                                400) from None


def plan_promotion(model: ModelRecord, target: ModelStage | str, reason: str, *,
                   current_production: ModelRecord | None, approval: Approval | None) -> Plan:
    """`approval` is what the caller could bring: manual (scope models:promote), auto (the policy
    passed) or None. Production without one is refused."""
    target = parse_stage(target)
    if model.stage == S.QUARANTINED and target != S.ARCHIVED:
        raise TransitionRefused("model_quarantined", f"model {model.model_id} is quarantined and can never be promoted")
    if model.stage == target:
        raise TransitionRefused("already_in_stage", f"model {model.model_id} is already {target}")
    if not can_promote(model.stage, target):
        raise TransitionRefused("invalid_transition", f"model {model.model_id} cannot move from {model.stage} to "
                                f"{target}; allowed: {', '.join(sorted(PROMOTIONS[model.stage])) or 'none'}")
    if target != S.PRODUCTION:
        return Plan((Transition(model.model_id, model.stage, target, reason),))
    if model.needs_reeval:
        raise TransitionRefused("needs_reeval", f"model {model.model_id} was trained on a base-model SHA that has"
                                " been replaced; it must pass re-evaluation first")
    if approval is None:
        raise TransitionRefused("approval_required", "promotion to production needs a caller with the"
                                " `models:promote` scope or an eval that passes the auto-promotion policy", 403)
    steps: list[Transition] = []
    replaced = None
    if current_production is not None and current_production.model_id != model.model_id:
        replaced = current_production.model_id
        steps.append(Transition(replaced, S.PRODUCTION, S.ARCHIVED, f"replaced by {model.model_id}"))
    steps.append(Transition(model.model_id, model.stage, S.PRODUCTION, reason, approval, replaced))
    return Plan(tuple(steps))


def plan_rollback(current: ModelRecord, previous: ModelRecord | None, reason: str) -> Plan:
    """Production goes back to the previous production version of the same name, in one step."""
    if current.stage != S.PRODUCTION:
        raise TransitionRefused("not_in_production", f"model {current.model_id} is {current.stage}, not production;"
                                " roll back the production version of the name")
    if previous is None:
        raise TransitionRefused("no_previous_version", f"{current.name} has no previous production version to"
                                " roll back to")
    if previous.needs_reeval:
        raise TransitionRefused("needs_reeval", f"the previous version {previous.model_id} was trained on a replaced"
                                " base-model SHA and has not passed re-evaluation")
    return Plan((Transition(current.model_id, S.PRODUCTION, S.ARCHIVED, f"rolled back: {reason}"),
                 Transition(previous.model_id, previous.stage, S.PRODUCTION, f"rollback of {current.model_id}: {reason}",
                            Approval.MANUAL, current.model_id)))


def plan_archive(model: ModelRecord, reason: str, *, can_approve: bool = True) -> Plan:
    """Archiving the production version takes it out of serving: it needs an approver."""
    if model.stage == S.ARCHIVED:
        raise TransitionRefused("already_in_stage", f"model {model.model_id} is already archived")
    if model.stage == S.PRODUCTION and not can_approve:
        raise TransitionRefused("insufficient_scope", "archiving the production version takes it out of serving:"
                                " it needs the `models:promote` scope", 403)
    return Plan((Transition(model.model_id, model.stage, S.ARCHIVED, reason),))
