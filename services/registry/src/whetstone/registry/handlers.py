"""Registry: job spec + final checkpoint + eval verdict -> a lineage-complete model."""

from __future__ import annotations

from whetstone.contracts import (
    CheckpointWrittenV1, Envelope, EvalCompletedV1, JobQueuedV1, Lineage, Metric, ModelPromotedV1, ModelRegisteredV1,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from .domain import stages as S


async def on_job_queued(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    await uow.conn.execute("INSERT INTO jobs (job_id, tenant_id, spec) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                           ev.job_id, env.tenant_id, ev.spec.model_dump(mode="json"))
    await register_if_ready(rt, uow, ev.job_id)


async def on_checkpoint_written(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: CheckpointWrittenV1) -> None:
    if ev.kind == "final":
        await uow.conn.execute("INSERT INTO final_checkpoints (job_id, uri, manifest_sha256, step) VALUES ($1,$2,$3,$4)"
                               " ON CONFLICT DO NOTHING", ev.job_id, ev.uri, ev.manifest_sha256, ev.step)
        await register_if_ready(rt, uow, ev.job_id)


async def on_eval_completed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: EvalCompletedV1) -> None:
    await uow.conn.execute("INSERT INTO evals (job_id, verdict, event) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                           ev.job_id, ev.verdict, ev.model_dump(mode="json"))
    await register_if_ready(rt, uow, ev.job_id)


async def register_if_ready(rt: Runtime, uow: UnitOfWork, job_id: str) -> None:
    job = await uow.conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
    ckpt = await uow.conn.fetchrow("SELECT * FROM final_checkpoints WHERE job_id = $1", job_id)
    ev = await uow.conn.fetchrow("SELECT * FROM evals WHERE job_id = $1", job_id)
    if not (job and ckpt and ev):
        return
    model_id = S.model_id_for(job_id)
    spec, evaluation = job["spec"], ev["event"]
    lineage = Lineage(job_id=job_id, base_model=spec["base_model"], base_model_sha256=spec["base_model_sha256"],
                      dataset_id=spec["dataset_id"], dataset_version=spec["dataset_version"], method=spec["method"],
                      hyperparameters_hash=spec["hyperparameters_hash"], eval_verdict=ev["verdict"],
                      eval_metrics=[Metric.model_validate(m) for m in evaluation["metrics"]])
    name = S.model_name(spec["base_model"], job["tenant_id"], job_id)
    inserted = await uow.conn.fetchval(
        "INSERT INTO models (model_id, job_id, tenant_id, name, stage, artifact_uri, artifact_sha256, lineage)"
        " VALUES ($1,$2,$3,$4,'dev',$5,$6,$7) ON CONFLICT DO NOTHING RETURNING 1",
        model_id, job_id, job["tenant_id"], name, ckpt["uri"], ckpt["manifest_sha256"], lineage.model_dump(mode="json"))
    if not inserted:
        return
    await uow.conn.execute("INSERT INTO stage_history (model_id, from_stage, to_stage, reason) VALUES ($1, NULL, 'dev',"
                           " 'registered')", model_id)
    await uow.publish(ModelRegisteredV1(model_id=model_id, name=name, stage="dev", artifact_uri=ckpt["uri"],
                                        artifact_sha256=ckpt["manifest_sha256"], lineage=lineage),
                      tenant_id=job["tenant_id"])
    target = S.stage_after_eval(ev["verdict"])
    reason = f"eval {ev['verdict']}: " + "; ".join(evaluation["reasons"])
    await promote(uow, model_id, job["tenant_id"], "dev", target, reason)


async def promote(uow: UnitOfWork, model_id: str, tenant_id: str, current: str, target: str, reason: str) -> None:
    if not S.can_promote(current, target):
        raise ValueError(f"model cannot move from {current} to {target}")
    await uow.conn.execute("UPDATE models SET stage = $2 WHERE model_id = $1", model_id, target)
    await uow.conn.execute("INSERT INTO stage_history (model_id, from_stage, to_stage, reason) VALUES ($1,$2,$3,$4)",
                           model_id, current, target, reason)
    await uow.publish(ModelPromotedV1(model_id=model_id, from_stage=current, to_stage=target, reason=reason),
                      tenant_id=tenant_id)
