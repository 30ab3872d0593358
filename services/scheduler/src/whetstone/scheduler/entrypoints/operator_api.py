"""Operator routes (the platform's operator only: the internal secret or a `platform` admin key): the
queue by tier, the nodes and the GPUs their jobs hold, dead letters per topic and their redrive. They
span every tenant, so a tenant's key (its admin key too) gets 403 `operator_only`."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel

from whetstone.contracts import TOPICS
from whetstone.contracts.topics import DLQ_SUFFIX
from whetstone.runtime import deadletters
from whetstone.runtime.http import ListObject, list_object, not_found, operator_only
from whetstone.runtime.identity import Caller, require_or_internal
from whetstone.runtime.service import Runtime

from ..adapters.operator_views import OperatorStore
from ..context import SchedulerContext
from ..domain.operator import node_loads, tier_loads


class TierView(BaseModel):
    tier: str
    rank: int | None
    wait_target_s: float | None
    queued: int
    active: int
    oldest_wait_s: float | None


class QueueView(BaseModel):
    object: Literal["operator.queue"] = "operator.queue"
    ordering: str
    tiers: list[TierView]


class NodeView(BaseModel):
    object: Literal["operator.node"] = "operator.node"
    id: str
    gpu_type: str
    gpu_count: int
    gpus_in_use: int
    gpu_memory_gb: float
    spot: bool
    state: str
    last_seen: int
    jobs: list[str]


class DeadLetterView(BaseModel):
    object: Literal["operator.dead_letters"] = "operator.dead_letters"
    id: str              # the source topic
    dlq_topic: str
    letters: int         # every letter in the topic (redriven ones stay there)
    replayable: int


class RedriveView(BaseModel):
    object: Literal["operator.redrive"] = "operator.redrive"
    topic: str
    redriven: int
    skipped: list[deadletters.Skipped]


def _unix(ts: datetime) -> int:
    return int(ts.timestamp())


def routes(rt: Runtime[SchedulerContext]) -> APIRouter:
    r = APIRouter(prefix="/v1/operator")

    def bootstrap() -> tuple[str, Any]:
        assert rt.settings.kafka_bootstrap is not None   # a running service always has one
        return rt.settings.kafka_bootstrap, rt.settings.kafka_client_options()

    @r.get("/queue")
    async def queue(caller: Caller = require_or_internal("read")) -> QueueView:
        operator_only(caller)
        async with rt.uow() as uow:
            counts = await OperatorStore(uow).tier_counts()
        loads = tier_loads(rt.ctx.policy.tiers, counts, rt.ctx.clock())
        return QueueView(ordering=rt.ctx.policy.ordering, tiers=[TierView(**asdict(t)) for t in loads])

    @r.get("/nodes")
    async def nodes(caller: Caller = require_or_internal("read")) -> ListObject[NodeView]:
        operator_only(caller)
        async with rt.uow() as uow:
            store = OperatorStore(uow)
            loads = node_loads(await store.nodes(), await store.placements())
        return list_object([NodeView(id=n.node_id, gpu_type=n.gpu_type, gpu_count=n.gpu_count, gpus_in_use=n.gpus_in_use,
                                     gpu_memory_gb=n.gpu_memory_gb, spot=n.spot, state=n.state,
                                     last_seen=_unix(n.last_seen), jobs=n.jobs) for n in loads])

    @r.get("/dead_letters")
    async def dead_letters(caller: Caller = require_or_internal("read")) -> ListObject[DeadLetterView]:
        operator_only(caller)
        servers, options = bootstrap()
        counts = await deadletters.count_letters(servers, [t.dlq for t in TOPICS.values()], options)
        return list_object([DeadLetterView(id=c.dlq_topic.removesuffix(DLQ_SUFFIX), dlq_topic=c.dlq_topic,
                                           letters=c.letters, replayable=c.replayable) for c in counts])

    @r.post("/dead_letters/{topic}/redrive")
    async def redrive(topic: str, caller: Caller = require_or_internal("admin"), event_id: str | None = None
                      ) -> RedriveView:
        operator_only(caller)
        source = topic.removesuffix(DLQ_SUFFIX)
        if source not in TOPICS:
            raise not_found(f"No topic named {topic!r}.", code="topic_not_found", param="topic")
        servers, options = bootstrap()
        letters = await deadletters.read_letters(servers, TOPICS[source].dlq, timeout_s=0.5, options=options)
        done = await deadletters.redrive(servers, source, letters, event_id=event_id, options=options)
        return RedriveView(topic=source, redriven=done.redriven, skipped=done.skipped)

    return r
