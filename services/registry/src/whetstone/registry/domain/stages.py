"""Model stages and identity. Pure."""

from __future__ import annotations

import hashlib

STAGES = ("dev", "staging", "production", "archived", "quarantined")
PROMOTIONS = {"dev": {"staging", "quarantined", "archived"}, "staging": {"production", "quarantined", "archived"},
              "production": {"archived"}, "quarantined": {"archived"}, "archived": set()}


def model_id_for(job_id: str) -> str:
    return "wsm-" + hashlib.sha256(job_id.encode()).hexdigest()[:20]


def model_name(base_model: str, tenant_id: str, job_id: str, suffix: str | None = None) -> str:
    base = base_model.rstrip("/").rsplit("/", 1)[-1]
    return f"ft:{base}:{tenant_id}:{suffix + ':' if suffix else ''}{job_id[-8:]}"


def stage_after_eval(verdict: str) -> str:
    """Passed -> staging (serving handoff); failed -> quarantined, never promoted."""
    return "staging" if verdict == "passed" else "quarantined"


def can_promote(current: str, target: str) -> bool:
    return target in PROMOTIONS.get(current, set())
