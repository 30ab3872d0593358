"""What one eval run evaluates: a job's final checkpoint on the base it was trained on, or an
`eval.requested` command's adapter on the base SHA the command names (e.g. a new base revision)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whetstone.contracts import EvalRequestedV1, TrainingSpec
from whetstone.runtime.models import (
    ResolvedModel,
    UnknownModel,
    resolve_model,
    weights_sha256,
)
from whetstone.runtime.s3 import ObjectStore, parse_uri, tenant_prefix

from ..domain.requests import base_mismatch
from ..domain.runs import EvalJob, FinalCheckpoint


@dataclass(frozen=True)
class Target:
    job_id: str
    checkpoint_uri: str
    manifest_sha256: str
    base_model: str
    base_model_sha256: str | None
    trace_id: str
    job: EvalJob | None = None                 # the job as eval projected it (None: a job eval never saw)
    eval_config: dict[str, Any] | None = None  # the gate settings as the job or the command sent them
    base_model_uri: str | None = None
    request_id: str | None = None              # set for a command: the answer carries it

    @property
    def spec(self) -> TrainingSpec | None:
        return self.job.spec if self.job else None

    @property
    def tier(self) -> str | None:
        return self.job.tier if self.job else None


def job_target(job: EvalJob, ckpt: FinalCheckpoint) -> Target:
    return Target(job_id=job.job_id, checkpoint_uri=ckpt.uri, manifest_sha256=ckpt.manifest_sha256,
                  base_model=job.spec.base_model, base_model_sha256=job.spec.base_model_sha256,
                  trace_id=ckpt.trace_id, job=job, eval_config=job.spec.eval_config)


def request_target(req: EvalRequestedV1, trace_id: str | None, job: EvalJob | None) -> Target:
    """The command's own fields win; the job projection (same tenant) adds validation data, method, tier and,
    when the command carries none, the job's eval_config."""
    return Target(job_id=req.job_id, checkpoint_uri=req.checkpoint_uri, manifest_sha256=req.manifest_sha256,
                  base_model=req.base_model, base_model_sha256=req.base_model_sha256,
                  trace_id=trace_id or "", job=job,
                  eval_config=req.eval_config if req.eval_config is not None else
                  (job.spec.eval_config if job else None),
                  base_model_uri=req.base_model_uri, request_id=req.request_id)


def request_problem(target: Target, tenant_id: str) -> str | None:
    """A command may only name an adapter stored under its own tenant's prefix."""
    try:
        _bucket, key = parse_uri(target.checkpoint_uri)
        prefix = tenant_prefix(tenant_id)
    except ValueError as exc:
        return f"checkpoint_uri unusable: {exc}"
    if not key.startswith(prefix):
        return f"checkpoint_uri {target.checkpoint_uri} is not stored under tenant {tenant_id}'s prefix {prefix}"
    return None


def resolve_base(target: Target, store: ObjectStore, catalog: Path | None, work: Path) -> ResolvedModel:
    """`base_model_uri` when the command gives one (an s3:// prefix, a local directory or a Hub id), else the
    base by name from the local catalog. UnknownModel when there are no weights to load."""
    uri = target.base_model_uri
    if not uri:
        return resolve_model(target.base_model, catalog)
    if uri.startswith("s3://"):
        dest = store.download_prefix(uri, work / "base")
        if not (dest / "config.json").is_file():
            raise UnknownModel(f"base model {target.base_model}: no config.json under {uri}")
        return ResolvedModel(uri, str(dest), weights_sha256(dest), True)
    return resolve_model(uri.removeprefix("file://"))


def base_problem(target: Target, base: ResolvedModel) -> str | None:
    """Weights other than the pinned ones are never evaluated: a command's SHA is always checked, a job's
    when its base is local (a Hub base is pinned by commit at training time)."""
    if not target.base_model_sha256:
        return None
    if target.request_id is None and not base.local:
        return None
    where = target.base_model_uri or f"the local catalog ({base.location})"
    return base_mismatch(target.base_model, target.base_model_sha256, base.sha256, where)
