"""Wiring: the eval service definition."""

from whetstone.runtime.service import Service

from . import handlers as H
from .adapters.migrations import MIGRATIONS
from .config import EvalSettings


def build_service(config: EvalSettings | None = None) -> Service:
    config = config or EvalSettings()
    return Service(name="eval", migrations=MIGRATIONS, http_port=config.http_port, state={"config": config},
                   subscriptions={"job.queued": H.on_job_queued, "checkpoint.written": H.on_checkpoint_written})
