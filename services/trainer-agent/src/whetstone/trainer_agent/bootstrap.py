"""Wiring: the trainer-agent service definition (one consumer group per node) and its context.

Every dependency of the handlers is here: the node's settings, the `runs` repository, the
node's in-memory state (segments running here, cancels and preempt requests being carried
out, the drain reason) and, once the runtime has its object store, the checkpoint store and
the scratch workspaces."""

from whetstone.runtime.service import Runtime, Service

from .adapters.metrics import event_metrics
from .adapters.migrations import MIGRATIONS
from .config import TrainerAgentSettings
from .context import TrainerAgentContext
from .entrypoints import handlers, loops


async def attach_storage(rt: Runtime[TrainerAgentContext]) -> None:
    rt.ctx.attach_storage(rt.store, rt.settings.data_dir, rt.settings.model_catalog)


def build_service(config: TrainerAgentSettings | None = None) -> Service[TrainerAgentContext]:
    config = config or TrainerAgentSettings()
    return Service(
        name="trainer-agent",
        group_id=f"whetstone-trainer-agent-{config.node_id}",
        migrations=MIGRATIONS,
        subscriptions={"job.assigned": handlers.on_job_assigned, "job.cancelled": handlers.on_job_cancelled,
                       "job.preempt_requested": handlers.on_job_preempt_requested,
                       "node.fenced": handlers.on_node_fenced},
        background=[loops.heartbeat, loops.supervise],
        # a cancel or fence heard before its assignment is remembered as long as a redelivery can come
        kept_like_inbox=[("cancelled_jobs", "cancelled_at"), ("fenced_attempts", "fenced_at")],
        on_start=attach_storage,
        on_stop=loops.drain,
        http_port=config.http_port,
        context=TrainerAgentContext(config=config),
        event_metrics=event_metrics,
    )
