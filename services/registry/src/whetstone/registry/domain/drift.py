"""Base-model SHA drift: may the serving fleet move to a new base SHA? Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from pydantic.dataclasses import dataclass as record

from whetstone.contracts.enums import ModelStage


class ReevalStatus(StrEnum):
    """A re-evaluation of a model against a new base SHA."""

    REQUESTED = "requested"
    PASSED = "passed"
    FAILED = "failed"


@record(frozen=True)
class BaseModelEntry:
    """A base model of the catalog at its current pinned SHA."""

    name: str
    sha256: str
    previous_sha256: str | None
    uri: str | None
    updated_at: datetime


@record(frozen=True)
class BaseVersion:
    """One published SHA of a base model (append-only history)."""

    sha256: str
    previous_sha256: str | None
    uri: str | None
    reason: str
    actor: str
    at: datetime


FIRST_PIN_ACTOR = "job.queued"   # the actor of a base's first version, pinned by a tenant's job


@record(frozen=True)
class ReevalRequest:
    """A model asked to pass the eval gate again against a new base SHA."""

    request_id: str
    model_id: str
    base_model: str
    base_model_sha256: str
    status: ReevalStatus


@record(frozen=True)
class PinnedAdapter:
    model_id: str
    tenant_id: str
    name: str
    stage: ModelStage
    base_model_sha256: str
    reeval_status: ReevalStatus | None  # None: never asked


@dataclass(frozen=True)
class RolloutBlocker:
    """A production adapter on another SHA that has not passed re-evaluation against the current one."""

    model_id: str
    tenant_id: str
    name: str
    pinned_sha256: str
    reeval_status: str
    reason: str


@dataclass(frozen=True)
class RolloutCheck:
    name: str
    current_sha256: str
    previous_sha256: str | None
    may_roll_out: bool
    checked: int
    blockers: list[RolloutBlocker] = field(default_factory=list)


def rollout_check(name: str, current_sha256: str, previous_sha256: str | None,
                  production: Sequence[PinnedAdapter]) -> RolloutCheck:
    """The fleet may move to `current_sha256` only when every production adapter of this base that
    is pinned to another SHA passed re-evaluation against the current one."""
    blockers: list[RolloutBlocker] = []
    checked = 0
    for a in production:
        if a.stage != ModelStage.PRODUCTION or a.base_model_sha256 == current_sha256:
            continue
        checked += 1
        if a.reeval_status != ReevalStatus.PASSED:
            why = {ReevalStatus.FAILED: "re-evaluation failed", ReevalStatus.REQUESTED: "re-evaluation pending",
                   None: "no re-evaluation against the new SHA"}[a.reeval_status]
            blockers.append(RolloutBlocker(a.model_id, a.tenant_id, a.name, a.base_model_sha256,
                                           a.reeval_status or "missing", why))
    return RolloutCheck(name, current_sha256, previous_sha256, not blockers, checked, blockers)


def reeval_request_id(model_id: str, base_sha256: str) -> str:
    return f"reeval-{model_id}-{base_sha256[:16]}"
