"""Merged weights of a model: the request's lifecycle and its ids. Pure."""

from __future__ import annotations

from enum import StrEnum

from pydantic.dataclasses import dataclass as record


class MergeState(StrEnum):
    REQUESTED = "requested"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@record(frozen=True)
class MergeRecord:
    """A model's merge request and, once answered, where the merged weights are."""

    merge_id: str
    model_id: str
    tenant_id: str
    status: MergeState
    uri: str | None
    manifest_sha256: str | None
    files: dict[str, str]
    merge_job_id: str | None
    error: str | None


def merge_id_for(model_id: str, previous: str | None = None) -> str:
    """`merge-<model>` first; after a failed merge, `merge-<model>~2`, `~3`...: a new id, so the
    scheduler makes a new job (its job id derives from the merge id) instead of finding the failed one."""
    if previous is None:
        return "merge-" + model_id
    _, sep, n = previous.rpartition("~")
    return f"merge-{model_id}~{int(n) + 1 if sep and n.isdigit() else 2}"


def merged_in_artifact(files: dict[str, str]) -> dict[str, str]:
    """The trainer saves merged weights under merged/ when a job asked for it."""
    return {rel: sha for rel, sha in files.items() if rel.startswith("merged/")}
