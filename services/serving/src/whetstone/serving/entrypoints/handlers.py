"""Serving's message handlers: each parses its contract event and calls one projection use case."""

from __future__ import annotations

from whetstone.contracts import CheckpointWrittenV1, Envelope, ModelPromotedV1, ModelRegisteredV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..context import ServingContext
from ..usecases import projection


async def on_model_registered(rt: Runtime[ServingContext], uow: UnitOfWork, env: Envelope,
                              ev: ModelRegisteredV1) -> None:
    await projection.model_registered(rt, uow, env.tenant_id, ev)


async def on_model_promoted(rt: Runtime[ServingContext], uow: UnitOfWork, env: Envelope, ev: ModelPromotedV1) -> None:
    await projection.model_promoted(rt, uow, env.tenant_id, ev)


async def on_checkpoint_written(rt: Runtime[ServingContext], uow: UnitOfWork, env: Envelope,
                                ev: CheckpointWrittenV1) -> None:
    await projection.checkpoint_written(rt, uow, env.tenant_id, ev)
