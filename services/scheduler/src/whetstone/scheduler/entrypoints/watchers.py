"""Background watchers: lost nodes, jobs whose training file never gets validated, queued jobs no
node can ever hold, and the Kubernetes node inventory. Each records facts and wakes the loop."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from whetstone.runtime.service import Runtime

from ..adapters.store import JobStore, NodeFacts
from ..context import SchedulerContext
from ..domain import jobs as rules
from ..domain.gang import lose_node
from ..domain.placement import could_ever_fit
from ..domain.timeouts import overdue
from ..usecases.admission import larger_than_pool, nodes_of, try_queue
from .loop import request_preemption

Rt = Runtime[SchedulerContext]


HEARTBEATS = "node.heartbeat"


async def heartbeats_caught_up(rt: Rt) -> bool:
    """True only when this consumer holds every node.heartbeat partition and has handled all
    that was produced to it: a node is silent only if the scheduler could have seen its beats."""
    lag = await rt.measure_lag()
    behind = {p: n for (topic, p), n in (lag or {}).items() if topic == HEARTBEATS}
    return bool(behind) and all(n == 0 for n in behind.values())


async def watch_lost_nodes(rt: Rt) -> None:
    """Nodes silent past the timeout are lost: their jobs are given up (fenced, re-queued). Never
    while the heartbeat partition is behind (a slow consumer is not a dead node)."""
    cfg = rt.ctx.config
    while True:
        await asyncio.sleep(cfg.lost_node_check_s)
        if not await heartbeats_caught_up(rt):
            rt.log.info("node.heartbeat not caught up: no node declared lost this round")
            continue
        async with rt.uow() as uow:
            store = JobStore(uow)
            for node_id in await store.mark_lost(rt.ctx.clock() - cfg.node_timeout):
                jobs = await preempt_jobs_on_node(rt, store, node_id, "node_lost")
                rt.log.warning("node lost", node_id=node_id, jobs=jobs)


async def preempt_jobs_on_node(rt: Rt, store: JobStore, node_id: str, reason: str) -> list[str]:
    """The node is gone: its jobs' segments are given up (job.preempted with what was checkpointed,
    node.fenced to every node of the segment, attempt fenced) and the jobs re-queued, or failed once
    re-queued `max_node_lost_requeues` times after lost nodes."""
    jobs = await store.jobs_on_node(node_id)
    for job in jobs:
        events = lose_node(job, rt.ctx.clock(), node_id, reason, await store.queue_position(job.sort_key, job.job_id),
                           rt.ctx.config.max_node_lost_requeues)
        await store.save(job)
        await store.publish(job, events)
    if jobs:
        await store.wake_scheduler()
    return [j.job_id for j in jobs]


async def watch_timeouts(rt: Rt) -> None:
    """Every non-terminal state on the platform's side has a timeout (provisioning, running without
    progress, checkpointing, evaluating): an overdue job is re-queued or fails (platform)."""
    cfg = rt.ctx.config
    limits = cfg.timeouts
    while True:
        await asyncio.sleep(cfg.timeout_check_s)
        async with rt.uow() as uow:
            store = JobStore(uow)
            now = rt.ctx.clock()
            for job in await store.quiet_since(now - timedelta(seconds=limits.shortest())):
                state = overdue(job, now, limits)
                if state is None:
                    continue
                events = job.time_out(now, state, getattr(limits, state),
                                      await store.queue_position(job.sort_key, job.job_id))
                await store.save(job)
                await store.publish(job, events)
                await store.wake_scheduler()
                rt.ctx.metrics.timeouts.labels(state=state).inc()
                rt.log.warning("job timed out", job_id=job.job_id, state=state, status=job.status)


async def expire_waiting_jobs(rt: Rt) -> None:
    """A job whose training file never gets validated fails with a clear reason instead of hanging:
    quickly when nobody ever submitted that dataset, after ``dataset_wait_s`` when validation stalls.
    A job still waiting for its validation file's verdict fails after ``dataset_wait_s`` too."""
    cfg = rt.ctx.config
    while True:
        await asyncio.sleep(min(2.0, cfg.unknown_dataset_grace_s / 2, cfg.dataset_wait_s / 2))
        async with rt.uow() as uow:
            store = JobStore(uow)
            now = rt.ctx.clock()
            for job, submitted in await store.waiting_since(now - timedelta(seconds=cfg.unknown_dataset_grace_s)):
                name = job.training_file
                if await store.dataset(job.tenant_id, name) is not None:
                    # the verdict committed while this job was being created, so neither saw the other
                    # (found by the chaos suite): queue it (or fail it with the verdict's reason) now
                    await try_queue(rt, store, job)
                    if job.status != rules.VALIDATING or job.created_at >= now - timedelta(seconds=cfg.dataset_wait_s):
                        continue   # queued (or failed with the verdict's reason), or still within the wait
                    events = job.fail(now, "validation_file_not_validated",
                                      f"validation_file {job.request.validation_file!r} has no validation verdict "
                                      f"after {cfg.dataset_wait_s:.0f}s: upload it (POST /v1/files or whet files "
                                      "upload) and use the file id it returns, or leave validation_file out",
                                      param="validation_file")
                elif not submitted:
                    events = job.fail(now, "unknown_training_file",
                                      f"training_file {name!r} is not a file this tenant uploaded: upload it first "
                                      "(POST /v1/files or whet files upload) and use the file id it returns")
                elif job.created_at < now - timedelta(seconds=cfg.dataset_wait_s):
                    events = job.fail(now, "training_file_not_validated",
                                      f"training_file {name!r} was uploaded but not validated within "
                                      f"{cfg.dataset_wait_s:.0f}s; try again later")
                else:
                    continue
                await store.save(job)
                await store.publish(job, events)
            await fail_unplaceable(rt, store)


async def fail_unplaceable(rt: Rt, store: JobStore) -> None:
    """A job admitted before any node was known, which no node of the pool can ever hold, fails
    (after a grace for nodes still joining) instead of waiting forever."""
    nodes = nodes_of(await store.pool_nodes())
    if not nodes:
        return
    now = rt.ctx.clock()
    for job in await store.queued_since(now - timedelta(seconds=rt.ctx.config.unplaceable_grace_s)):
        if any(could_ever_fit(s, nodes) for s in job.shapes):
            continue
        refusal = larger_than_pool("this job needs", job.shapes, nodes)
        events = job.fail(now, refusal.code, refusal.message)
        await store.save(job)
        await store.publish(job, events)


async def apply_node_change(rt: Rt, store: JobStore, kind: str, node: Any) -> None:
    """One node from the Kubernetes inventory: upsert it; a deleted node is lost; a cordoned or
    spot-interruption-tainted node gets no new work and its jobs are told to checkpoint and stop."""
    if kind == "DELETED":
        await store.node_deleted(node.node_id)
        await preempt_jobs_on_node(rt, store, node.node_id, "spot_loss" if node.spot else "node_lost")
        return
    await store.upsert_node(NodeFacts(**dataclasses.asdict(node), seen_at=rt.ctx.clock()))
    await store.wake_scheduler()
    if node.unschedulable_reason in ("spot_loss", "drain"):
        what = "spot interruption notice" if node.unschedulable_reason == "spot_loss" else "node drain"
        for job in await store.jobs_on_node(node.node_id):
            await request_preemption(rt, store, job.job_id, node.unschedulable_reason,
                                     f"{what} on node {node.node_id}")


async def sync_kubernetes(rt: Rt) -> None:
    """List GPU nodes, then watch them; relist when the watch expires or its resourceVersion is too old."""
    from ..adapters.k8s_inventory import KubernetesInventory, connect  # noqa: PLC0415

    cfg = rt.ctx.config
    inventory = KubernetesInventory(await connect(cfg.k8s_host), cfg.k8s_label_selector)
    while True:
        nodes = await inventory.list_nodes()
        async with rt.uow() as uow:
            store = JobStore(uow)
            for node in nodes:
                await apply_node_change(rt, store, "ADDED", node)
        rt.log.info("kubernetes inventory listed", nodes=len(nodes), resource_version=inventory.resource_version)
        try:
            async for change in inventory.watch(timeout_seconds=300):
                async with rt.uow() as uow:
                    await apply_node_change(rt, JobStore(uow), change.kind, change.node)
        except Exception as exc:  # 410 Gone, connection reset: relist after a pause
            rt.log.warning("kubernetes watch ended; relisting", error=str(exc))
            await asyncio.sleep(1.0)
