"""Wiring: the metering service definition."""

from whetstone.runtime.service import Service

from . import handlers as H
from .adapters.migrations import MIGRATIONS
from .api import routes
from .config import MeteringSettings


def build_service(config: MeteringSettings | None = None) -> Service:
    config = config or MeteringSettings()
    return Service(name="metering", migrations=MIGRATIONS, routes=routes, http_port=config.http_port,
                   subscriptions={"job.started": H.on_job_started, "job.completed": H.on_job_completed,
                                  "job.failed": H.on_job_failed, "job.preempted": H.on_job_preempted},
                   state={"config": config})
