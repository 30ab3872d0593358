"""The eval worker: claim an evaluation, run its stages in a thread (no transaction open, no Kafka
partition held), record each stage, then publish `eval.completed` in one short transaction.

Claims carry a lease renewed by a heartbeat. A worker that dies stops renewing; when the lease
runs out another worker (this process after a restart, or another replica: they form a group
through the table, `FOR UPDATE SKIP LOCKED`) claims it and resumes after the last recorded
stage. A worker that lost its lease can record nothing more and cannot publish: no doubles.

A run is a job's own evaluation or an `eval.requested` command (`targets.py`); both go the same way."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import uuid
from pathlib import Path

from whetstone.contracts import EvalCompletedV1, EvalStageResult
from whetstone.runtime.checkpoints import CorruptCheckpoint, download_checkpoint
from whetstone.runtime.delivery import unavailable_dependency
from whetstone.runtime.leases import wait_for_work
from whetstone.runtime.models import UnknownModel
from whetstone.runtime.service import Runtime

from ..adapters import repository
from ..adapters.repository import Claim, LeaseLost
from ..context import EvalContext
from ..domain.policy import STAGES, GatePolicy, PolicyError, resolve_policy
from ..domain.stages import failed, skipped, verdict
from ..usecases.pipeline import Candidate, GateTools, run_gate
from ..usecases.targets import Target, base_problem, job_target, request_problem, request_target, resolve_base

NON_CHAT_METHODS = ("cpt",)  # continued pre-training on raw text: no chat answers to judge


async def eval_worker(rt: Runtime[EvalContext]) -> None:
    cfg = rt.ctx.config
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    while True:
        claim = await repository.claim_next(rt.pool, owner, cfg.lease_s)
        if claim is None:
            await wait_for_work(rt.ctx.wakeup, cfg.poll_s)
            continue
        await evaluate_claim(rt, claim)


def lineage_key(tenant_id: str, spec: dict) -> str:
    """Same lineage = same tenant, same base weights, same model suffix."""
    return f"{tenant_id}|{spec.get('base_model_sha256', '')}|{spec.get('suffix') or ''}"


async def evaluate_claim(rt: Runtime[EvalContext], claim: Claim) -> None:
    cfg = rt.ctx.config
    log = rt.log.bind(job_id=claim.job_id, run_id=claim.run_id, tenant_id=claim.tenant_id, attempt=claim.attempts)
    heartbeat = asyncio.create_task(repository.EVAL_RUNS.keep_renewed(
        rt.pool, claim.run_id, claim.owner, cfg.lease_s, on_lost=lambda: log.warning("eval lease lost")))
    try:
        inputs = await repository.load_inputs(rt.pool, claim)
        done = inputs["done"]
        if claim.request is None:
            target = job_target(inputs["job"], inputs["checkpoint"])
        else:
            target = request_target(claim, inputs["job"])
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
                last = None   # a command re-checks an adapter on other weights: no lineage to compare with
                if target.request_id is None:
                    last = await repository.last_accepted(rt.pool, lineage_key(claim.tenant_id, target.spec),
                                                          claim.job_id)
                loop = asyncio.get_running_loop()

                def on_stage(result: EvalStageResult) -> None:
                    asyncio.run_coroutine_threadsafe(repository.record_stage(rt.pool, claim, result), loop).result()
                    log.info("eval stage finished", stage=result.name, status=result.status, reason=result.reason)

                tools = GateTools(cache=repository.PgScoreCache(rt.pool, loop), task_dir=cfg.task_dir,
                                  safety_prompts=cfg.safety_prompts, judge=rt.ctx.judge,
                                  safety_classifier=rt.ctx.safety_classifier, max_len=cfg.max_len,
                                  lm_eval_batch_size=cfg.lm_eval_batch_size)
                stages = await asyncio.to_thread(_evaluate, rt, claim, target, last, policy, tools, done, on_stage,
                                                 log)
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
        await repository.record_failure(rt.pool, claim, error)
    finally:
        heartbeat.cancel()


async def _retry_later(rt: Runtime[EvalContext], claim: Claim, error: str) -> float | None:
    """Record a transient failure; the database may be the dependency that is out, so keep trying to record it
    (the lease would hand the run to another claim anyway if this never succeeds)."""
    cfg = rt.ctx.config
    for pause in (0.5, 1, 2, 4, 8):
        try:
            return await repository.record_transient_failure(
                rt.pool, claim, error, backoff_s=cfg.transient_backoff_s, backoff_max_s=cfg.transient_backoff_max_s,
                budget_s=cfg.transient_budget_s)
        except Exception as exc:  # noqa: BLE001
            if unavailable_dependency(exc) is None:
                raise
            await asyncio.sleep(pause)
    return None


def _evaluate(rt: Runtime[EvalContext], claim: Claim, target: Target, last: dict | None, policy: GatePolicy,
              tools: GateTools, done: dict, on_stage, log) -> list[EvalStageResult]:
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
        if spec.get("validation_uri"):
            holdout = rt.store.download_file(spec["validation_uri"], work / "holdout.jsonl")
        last_dir = None
        if last:
            try:
                download_checkpoint(rt.store, last["adapter_uri"], work / "last", last["adapter_manifest_sha256"])
                last_dir = str(work / "last")
            except CorruptCheckpoint as exc:
                log.warning("last accepted adapter unusable; comparing with base only", error=str(exc))
        candidate = Candidate(job_id=target.job_id, base_dir=base.location, base_sha=base.sha256,
                              adapter_dir=str(work / "adapter"), holdout_path=holdout, last_adapter_dir=last_dir,
                              chat=spec.get("method") not in NON_CHAT_METHODS,
                              reinforcement=spec.get("reinforcement") if spec.get("method") == "reinforcement" else None)
        if not spec:
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
    metrics = [m for s in stages for m in s.metrics]
    event = EvalCompletedV1(job_id=target.job_id, checkpoint_uri=target.checkpoint_uri, verdict=outcome,
                            reasons=reasons + list(notes), metrics=metrics, stages=stages,
                            request_id=target.request_id, base_model_sha256=target.base_model_sha256)
    loss = next((m.candidate for m in metrics if m.name == "holdout_loss"), None)
    async with rt.uow() as uow:
        if target.request_id is not None:
            publish = await repository.finish_request(uow.conn, claim, verdict=outcome)
        else:
            publish = await repository.finish(uow.conn, claim, lineage_key=lineage_key(claim.tenant_id, target.spec),
                                              verdict=outcome, candidate_loss=loss, adapter_uri=target.checkpoint_uri,
                                              adapter_manifest_sha256=target.manifest_sha256,
                                              event=event.model_dump(mode="json"))
        if publish:
            await uow.publish(event, tenant_id=claim.tenant_id, trace_id=target.trace_id)
    rt.log.info("evaluated", job_id=target.job_id, request_id=target.request_id, verdict=outcome,
                stages={s.name: s.status for s in stages})
