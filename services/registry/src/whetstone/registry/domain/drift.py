"""Base-model SHA drift: may the serving fleet move to a new base SHA? Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PinnedAdapter:
    model_id: str
    tenant_id: str
    name: str
    stage: str
    base_model_sha256: str
    reeval_status: str | None  # None (never asked) | requested | passed | failed


@dataclass(frozen=True)
class RolloutCheck:
    name: str
    current_sha256: str
    previous_sha256: str | None
    may_roll_out: bool
    checked: int
    blockers: list[dict] = field(default_factory=list)


def rollout_check(name: str, current_sha256: str, previous_sha256: str | None,
                  production: Sequence[PinnedAdapter]) -> RolloutCheck:
    """The fleet may move to `current_sha256` only when every production adapter of this base that
    is pinned to another SHA passed re-evaluation against the current one."""
    blockers = []
    checked = 0
    for a in production:
        if a.stage != "production" or a.base_model_sha256 == current_sha256:
            continue
        checked += 1
        if a.reeval_status != "passed":
            why = {"failed": "re-evaluation failed", "requested": "re-evaluation pending"}.get(
                a.reeval_status or "", "no re-evaluation against the new SHA")
            blockers.append({"model_id": a.model_id, "tenant_id": a.tenant_id, "name": a.name,
                             "pinned_sha256": a.base_model_sha256, "reeval_status": a.reeval_status or "missing",
                             "reason": why})
    return RolloutCheck(name, current_sha256, previous_sha256, not blockers, checked, blockers)


def reeval_request_id(model_id: str, base_sha256: str) -> str:
    return f"reeval-{model_id}-{base_sha256[:16]}"
