"""Evaluate one claimed run: resolve what it evaluates (`targets.py`), run its stages in a thread (no
transaction open, no Kafka partition held), record each stage, then publish `eval.completed` in one
short transaction.

A worker that lost its lease can record nothing more and cannot publish: no doubles. A run is a job's
own evaluation or an `eval.requested` command; both go the same way."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import asyncpg
from whetstone.contracts import EvalCompletedV1, EvalStageResult
from whetstone.contracts.enums import SpecMethod
from whetstone.runtime.checkpoints import CorruptCheckpoint, download_checkpoint
from whetstone.runtime.delivery import unavailable_dependency
from whetstone.runtime.models import UnknownModel
from whetstone.runtime.service import Runtime

from ..adapters.repository import EVAL_RUNS, EvalStore, LeaseLost, PgScoreCache
from ..context import EvalContext
from ..domain.policy import STAGES, GatePolicy, PolicyError, resolve_policy
from ..domain.runs import AcceptedAdapter, Claim, lineage_key
from ..domain.stages import failed, skipped, verdict
from .pipeline import Candidate, GateTools, run_gate
from .targets import (
    Target,
    base_problem,
    job_target,
    request_problem,
    request_target,
    resolve_base,
)

NON_CHAT_METHODS = (SpecMethod.CPT,)  # continued pre-training on raw text: no chat answers to judge


def _pool(rt: Runtime[EvalContext]) -> asyncpg.Pool:
    if rt.pool is None:
        raise RuntimeError("the eval service has no database pool: it is not started")
    return rt.pool


async def evaluate_claim(rt: Runtime[EvalContext], claim: Claim) -> None:
    cfg = rt.ctx.config
    log = rt.log.bind(job_id=claim.job_id, run_id=claim.run_id, tenant_id=claim.tenant_id, attempt=claim.attempts)
    heartbeat = asyncio.create_task(EVAL_RUNS.keep_renewed(
        _pool(rt), claim.run_id, claim.owner, cfg.lease_s, on_lost=lambda: log.warning("eval lease lost")))
    try:
        async with _pool(rt).acquire() as conn:
            inputs = await EvalStore(conn).inputs(claim)
        if claim.request is not None:
            target = request_target(claim.request, claim.trace_id, inputs.job)
        elif inputs.job is not None and inputs.checkpoint is not None:
            target = job_target(inputs.job, inputs.checkpoint)
        else:
            raise LookupError(f"run {claim.run_id}: the job or its final checkpoint is no longer recorded")
        notes: tuple[str, ...] = ()
        if claim.attempts > cfg.max_attempts:
            stages = [failed("evaluation", f"evaluation crashed {claim.attempts - 1} times; giving up so the job "
                                           "is not stuck (see eval service logs)")]
        else:
            try:
                policy = resolve_policy(target.eval_config, tenant_defaults=cfg.tenant_defaults.get(claim.tenant_id),
                                        tier=target.tier, tiers_may_skip_safety=frozenset(cfg.tiers_may_skip_safety))
            except PolicyError as exc:
                policy, stages = None, [failed("config", f"invalid eval_config: {exc}")]
            if policy is not None:
                notes = policy.notes
                stages = await _run_stages(rt, claim, target, policy, inputs.done, log)
        await _publish(rt, claim, target, stages, notes)
    except LeaseLost as exc:
        log.warning("eval abandoned: lease lost", error=str(exc))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        if (dependency := unavailable_dependency(exc)) is not None:
            # S3 or the database is out: wait and retry (capped backoff) without spending a crash attempt
            pause = await _retry_later(rt, claim, error)
            log.warning("eval attempt hit an unreachable dependency; retrying", dependency=dependency, error=error,
                        retry_in_s=pause)
            return
        # back to pending: the next claim retries, or (attempts spent) publishes a failed verdict
        log.exception("eval attempt crashed", attempts_left=max(cfg.max_attempts - claim.attempts, 0))
        async with _pool(rt).acquire() as conn:
            await EvalStore(conn).record_failure(claim, error)
    finally:
        heartbeat.cancel()


async def _run_stages(rt: Runtime[EvalContext], claim: Claim, target: Target, policy: GatePolicy,
                      done: Mapping[str, EvalStageResult], log: Any) -> list[EvalStageResult]:
    cfg = rt.ctx.config
    last = None   # a command re-checks an adapter on other weights: no lineage to compare with
    if target.request_id is None:
        async with _pool(rt).acquire() as conn:
            last = await EvalStore(conn).last_accepted(lineage_key(claim.tenant_id, target.job), claim.job_id)
    loop = asyncio.get_running_loop()

    async def record(result: EvalStageResult) -> None:
        async with _pool(rt).acquire() as conn, conn.transaction():
            await EvalStore(conn).record_stage(claim, result)

    def on_stage(result: EvalStageResult) -> None:
        asyncio.run_coroutine_threadsafe(record(result), loop).result()
        log.info("eval stage finished", stage=result.name, status=result.status, reason=result.reason)

    tools = GateTools(cache=PgScoreCache(_pool(rt), loop), task_dir=cfg.task_dir, safety_prompts=cfg.safety_prompts,
                      judge=rt.ctx.judge, safety_classifier=rt.ctx.safety_classifier, max_len=cfg.max_len,
                      lm_eval_batch_size=cfg.lm_eval_batch_size)
    return await asyncio.to_thread(_evaluate, rt, claim, target, last, policy, tools, done, on_stage, log)


async def _retry_later(rt: Runtime[EvalContext], claim: Claim, error: str) -> float | None:
    """Record a transient failure; the database may be the dependency that is out, so keep trying to record it
    (the lease would hand the run to another claim anyway if this never succeeds)."""
    cfg = rt.ctx.config
    for pause in (0.5, 1, 2, 4, 8):
        try:
            async with _pool(rt).acquire() as conn:
                return await EvalStore(conn).record_transient_failure(
                    claim, error, backoff_s=cfg.transient_backoff_s, backoff_max_s=cfg.transient_backoff_max_s,
                    budget_s=cfg.transient_budget_s)
        except Exception as exc:
            if unavailable_dependency(exc) is None:
                raise
            await asyncio.sleep(pause)
    return None


def _evaluate(rt: Runtime[EvalContext], claim: Claim, target: Target, last: AcceptedAdapter | None,
              policy: GatePolicy, tools: GateTools, done: Mapping[str, EvalStageResult],
              on_stage: Callable[[EvalStageResult], None], log: Any) -> list[EvalStageResult]:
    """Worker thread: fetch and verify the artifacts (the base weights included), then run the stages."""
    spec = target.spec
    with tempfile.TemporaryDirectory(prefix="eval-") as tmp:
        work = Path(tmp)
        if target.request_id and (problem := request_problem(target, claim.tenant_id)):
            return _unverified(problem)
        try:
            base = resolve_base(target, rt.store, rt.settings.model_catalog, work)
        except UnknownModel as exc:
            return _unverified(str(exc), stage="base_model")
        if problem := base_problem(target, base):
            return _unverified(problem, stage="base_model")
        try:
            download_checkpoint(rt.store, target.checkpoint_uri, work / "adapter", target.manifest_sha256)
        except CorruptCheckpoint as exc:
            return _unverified(f"adapter failed verification: {exc}")
        holdout = None
        if spec is not None and spec.validation_uri:
            holdout = rt.store.download_file(spec.validation_uri, work / "holdout.jsonl")
        last_dir = None
        if last:
            try:
                download_checkpoint(rt.store, last.adapter_uri, work / "last", last.adapter_manifest_sha256)
                last_dir = str(work / "last")
            except CorruptCheckpoint as exc:
                log.warning("last accepted adapter unusable; comparing with base only", error=str(exc))
        candidate = Candidate(job_id=target.job_id, base_dir=base.location, base_sha=base.sha256,
                              adapter_dir=str(work / "adapter"), holdout_path=holdout, last_adapter_dir=last_dir,
                              chat=spec is None or spec.method not in NON_CHAT_METHODS,
                              reinforcement=spec.reinforcement
                              if spec is not None and spec.method == SpecMethod.REINFORCEMENT else None)
        if spec is None:
            candidate.holdout_missing_reason = f"job {target.job_id} is unknown to the eval service: no validation file"
        return run_gate(candidate, policy, tools, done=done, on_stage=on_stage,
                        log=lambda msg, **kw: log.error(msg, **kw))


def _unverified(reason: str, stage: str = "artifact") -> list[EvalStageResult]:
    what = "the base model" if stage == "base_model" else "the artifact"
    return [failed(stage, reason)] + [skipped(s, f"not run: {what} could not be verified") for s in STAGES]


async def _publish(rt: Runtime[EvalContext], claim: Claim, target: Target, stages: list[EvalStageResult],
                   notes: tuple[str, ...] = ()) -> None:
    """One short transaction: the run is done (while we hold its lease) and the answer is in the outbox."""
    outcome, reasons = verdict(stages)
    event = EvalCompletedV1(job_id=target.job_id, checkpoint_uri=target.checkpoint_uri, verdict=outcome,
                            reasons=reasons + list(notes), metrics=[m for s in stages for m in s.metrics],
                            stages=stages, request_id=target.request_id, base_model_sha256=target.base_model_sha256)
    async with rt.uow() as uow:
        store = EvalStore(uow.conn)
        if target.request_id is not None:
            publish = await store.finish_request(claim, outcome)
        else:
            publish = await store.finish(claim, event, lineage_key=lineage_key(claim.tenant_id, target.job),
                                         adapter_manifest_sha256=target.manifest_sha256)
        if publish:
            await uow.publish(event, tenant_id=claim.tenant_id, trace_id=target.trace_id)
    rt.log.info("evaluated", job_id=target.job_id, request_id=target.request_id, verdict=outcome,
                stages={s.name: s.status for s in stages})
