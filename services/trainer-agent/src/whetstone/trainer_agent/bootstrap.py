"""Wiring: the trainer-agent service definition (one consumer group per node)."""

import asyncio

from whetstone.runtime.service import Service

from . import handlers as H
from .adapters.migrations import MIGRATIONS
from .config import TrainerAgentSettings


def build_service(config: TrainerAgentSettings | None = None) -> Service:
    config = config or TrainerAgentSettings()
    return Service(
        name="trainer-agent",
        group_id=f"whetstone-trainer-agent-{config.node_id}",
        migrations=MIGRATIONS,
        subscriptions={"job.assigned": H.on_job_assigned, "job.cancelled": H.on_job_cancelled,
                       "job.preempt_requested": H.on_job_preempt_requested},
        background=[H.heartbeat, H.supervise],
        on_stop=H.drain,
        http_port=config.http_port,
        state={
            "config": config,
            "wakeup": asyncio.Event(),
            "segments": {},        # segment_id -> handlers.Segment running on this node
            "cancelled": set(),    # job ids cancelled while running here
            "tasks": set(),        # the segments' supervising tasks
            "stopping": None,      # set by drain: the preemption reason (drain | spot_loss)
            "preempt_reasons": {},  # job id -> reason of a job.preempt_requested being carried out
        },
    )
