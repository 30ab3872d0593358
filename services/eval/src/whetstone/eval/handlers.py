"""Eval: on a job's final checkpoint, score base vs adapter on the holdout and decide."""

from __future__ import annotations

import asyncio

from whetstone.contracts import CheckpointWrittenV1, Envelope, EvalCompletedV1, JobQueuedV1, Metric
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.models import resolve_model
from whetstone.runtime.service import Runtime

from .adapters.scoring import score
from .config import EvalSettings
from .domain.gate import GatePolicy, decide


async def on_job_queued(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    await uow.conn.execute("INSERT INTO jobs (job_id, tenant_id, spec) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                           ev.job_id, env.tenant_id, ev.spec.model_dump(mode="json"))
    await evaluate_if_ready(rt, uow, ev.job_id)


async def on_checkpoint_written(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: CheckpointWrittenV1) -> None:
    if ev.kind != "final":
        return
    await uow.conn.execute(
        "INSERT INTO final_checkpoints (job_id, tenant_id, uri, manifest_sha256, trace_id) VALUES ($1,$2,$3,$4,$5)"
        " ON CONFLICT DO NOTHING", ev.job_id, env.tenant_id, ev.uri, ev.manifest_sha256, env.trace_id)
    await evaluate_if_ready(rt, uow, ev.job_id)


async def evaluate_if_ready(rt: Runtime, uow: UnitOfWork, job_id: str) -> None:
    cfg: EvalSettings = rt.state["config"]
    job = await uow.conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
    ckpt = await uow.conn.fetchrow("SELECT * FROM final_checkpoints WHERE job_id = $1", job_id)
    if job is None or ckpt is None or await uow.conn.fetchval("SELECT 1 FROM results WHERE job_id = $1", job_id):
        return
    spec = job["spec"]
    holdout = spec.get("validation_uri") or spec["train_uri"]
    location = (await asyncio.to_thread(resolve_model, spec["base_model"], rt.settings.model_catalog)).location
    scores = await asyncio.to_thread(score, rt.store, location, ckpt["uri"], ckpt["manifest_sha256"], holdout,
                                     cfg.max_holdout_rows, cfg.max_len)
    lineage_key = f"{job['tenant_id']}|{spec['base_model_sha256']}|{spec['dataset_id']}"
    last = await uow.conn.fetchval(
        "SELECT candidate_loss FROM results WHERE lineage_key = $1 AND verdict = 'passed'"
        " ORDER BY created_at DESC LIMIT 1", lineage_key)
    base, cand = scores["base"], scores["candidate"]
    verdict, reasons = decide(base["loss"], cand["loss"], last,
                              GatePolicy(cfg.min_improvement, cfg.max_regression_vs_last))
    if not spec.get("validation_uri"):
        reasons.append("no validation split: scored on training data, which overstates quality")
    event = EvalCompletedV1(
        job_id=job_id, checkpoint_uri=ckpt["uri"], verdict=verdict, reasons=reasons,
        metrics=[Metric(name="holdout_loss", base=base["loss"], candidate=cand["loss"], last_accepted=last),
                 Metric(name="holdout_perplexity", base=base["perplexity"], candidate=cand["perplexity"]),
                 Metric(name="holdout_tokens", candidate=float(cand["tokens"]), higher_is_better=True)])
    await uow.conn.execute(
        "INSERT INTO results (job_id, tenant_id, lineage_key, verdict, candidate_loss, event) VALUES ($1,$2,$3,$4,$5,$6)",
        job_id, job["tenant_id"], lineage_key, verdict, cand["loss"], event.model_dump(mode="json"))
    rt.log.info("evaluated", job_id=job_id, verdict=verdict, base_loss=base["loss"], candidate_loss=cand["loss"])
    await uow.publish(event, tenant_id=job["tenant_id"], trace_id=ckpt["trace_id"])
