"""Wiring: the ingest service definition."""

from whetstone.runtime.service import Service

from . import handlers as H
from .adapters.migrations import MIGRATIONS
from .config import IngestSettings


def build_service(config: IngestSettings | None = None) -> Service:
    config = config or IngestSettings()
    return Service(name="ingest", migrations=MIGRATIONS,
                   subscriptions={"dataset.submitted": H.on_dataset_submitted},
                   http_port=config.http_port, state={"config": config})
