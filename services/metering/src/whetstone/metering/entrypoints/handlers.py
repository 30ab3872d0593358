"""Message handlers: the lifecycle events metering consumes, handed to the metering use case."""

from __future__ import annotations

from whetstone.contracts import Envelope, Event, topic_for
from whetstone.runtime.batching import Delivery
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..context import MeteringContext
from ..usecases.metering import METERED_TOPICS, meter

TOPICS = METERED_TOPICS


async def on_lifecycle_batch(rt: Runtime[MeteringContext], uow: UnitOfWork, deliveries: list[Delivery]) -> None:
    """A batch of never-seen events, claimed in the inbox in this same transaction."""
    await meter(rt, uow, deliveries)


async def on_lifecycle_event(rt: Runtime[MeteringContext], uow: UnitOfWork, env: Envelope, ev: Event) -> None:
    """One event (a batch that failed is retried message by message through it)."""
    await meter(rt, uow, [Delivery(topic_for(ev).name, env, ev)])
