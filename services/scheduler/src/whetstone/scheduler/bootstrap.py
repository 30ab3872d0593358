"""Wiring: the scheduler service definition."""

from dataclasses import fields

from whetstone.runtime.service import Service

from . import handlers as H
from .adapters.migrations import MIGRATIONS
from .api import routes
from .config import SchedulerSettings


def build_service(config: SchedulerSettings | None = None) -> Service:
    config = config or SchedulerSettings()
    background = [H.watch_lost_nodes, H.expire_waiting_jobs, H.scheduling_loop]
    if config.k8s_inventory:
        background.append(H.sync_kubernetes)
    # job.requested -> job.assigned is latency-bound: poll the broker often instead of the client's
    # 500 ms default fetch wait (the embedded broker answers an idle fetch only when it expires).
    # Passed only where the runtime's Service accepts consumer options.
    consumer = {"consumer_options": {"fetch_max_wait_ms": config.fetch_max_wait_ms}} \
        if any(f.name == "consumer_options" for f in fields(Service)) else {}
    return Service(
        name="scheduler",
        migrations=MIGRATIONS,
        subscriptions={
            "job.requested": H.on_job_requested,
            "dataset.submitted": H.on_dataset_submitted,
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
        background=background,
        http_port=config.http_port,
        state={"config": config, "policy": config.policy()},
        **consumer,
    )
