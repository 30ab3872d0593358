"""Wiring: the registry service definition."""

from whetstone.runtime.service import Service

from . import handlers as H
from .adapters.migrations import MIGRATIONS
from .api import routes
from .config import RegistrySettings


def build_service(config: RegistrySettings | None = None) -> Service:
    config = config or RegistrySettings()
    return Service(name="registry", migrations=MIGRATIONS, routes=routes, http_port=config.http_port,
                   state={"config": config},
                   subscriptions={"job.queued": H.on_job_queued, "checkpoint.written": H.on_checkpoint_written,
                                  "eval.completed": H.on_eval_completed})
