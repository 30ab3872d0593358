"""Wiring: the scheduler service definition."""

from whetstone.runtime.service import Service

from . import handlers as H
from .adapters.migrations import MIGRATIONS
from .api import routes
from .config import SchedulerSettings


def build_service(config: SchedulerSettings | None = None) -> Service:
    config = config or SchedulerSettings()
    return Service(
        name="scheduler",
        migrations=MIGRATIONS,
        subscriptions={
            "job.requested": H.on_job_requested,
            "dataset.validated": H.on_dataset_validated,
            "node.heartbeat": H.on_node_heartbeat,
            "job.started": H.on_job_started,
            "job.progress": H.on_job_progress,
            "checkpoint.written": H.on_checkpoint_written,
            "job.preempted": H.on_job_preempted,
            "job.completed": H.on_job_completed,
            "job.failed": H.on_job_failed,
            "eval.completed": H.on_eval_completed,
            "usage.metered": H.on_usage_metered,
        },
        routes=routes,
        background=[H.watch_lost_nodes, H.expire_waiting_jobs],
        http_port=config.http_port,
        state={"config": config},
    )
