"""Evaluation commands (`eval.requested`, e.g. a re-evaluation after a base-model update): pure rules."""

from __future__ import annotations

REQUEST_RUN_PREFIX = "request:"


def request_run_id(tenant_id: str, request_id: str) -> str:
    """The run key of a command: apart from the job's own run (keyed by job_id), one per tenant + request id,
    so a job's first evaluation and each of its re-evaluations coexist and a redelivered command is not re-run."""
    return f"{REQUEST_RUN_PREFIX}{tenant_id}:{request_id}"


def base_mismatch(base_model: str, requested_sha256: str, available_sha256: str, where: str) -> str | None:
    """The reason not to evaluate, when the weights at hand are not the ones the command names."""
    if available_sha256 == requested_sha256:
        return None
    return (f"base model {base_model}: the weights at {where} have sha256 {available_sha256[:12] or '?'},"
            f" not the pinned {requested_sha256[:12]}; not evaluating against other weights")
