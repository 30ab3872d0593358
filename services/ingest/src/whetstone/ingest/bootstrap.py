"""Wiring: the ingest service definition and every dependency its handlers use (`IngestContext`)."""

from whetstone.runtime.service import Service

from .adapters import validations, wandb_runs
from .adapters.metrics import event_metrics
from .adapters.migrations import MIGRATIONS
from .config import IngestSettings
from .context import IngestContext
from .entrypoints import api
from .entrypoints.handlers import SUBSCRIPTIONS
from .entrypoints.wandb_worker import wandb_worker
from .entrypoints.worker import validation_worker
from .usecases.gates import toxicity_classifier


def build_service(config: IngestSettings | None = None) -> Service[IngestContext]:
    config = config or IngestSettings()
    context = IngestContext(config=config, toxicity=toxicity_classifier(config))
    return Service(name="ingest", migrations=MIGRATIONS,
                   subscriptions=SUBSCRIPTIONS,
                   http_port=config.http_port, context=context, routes=api.routes,
                   background=[*[validation_worker] * config.validation_workers, wandb_worker],
                   probes=validations.PROBES + wandb_runs.PROBES,
                   event_metrics=event_metrics,
                   upload_paths=("/v1/files",))   # streamed to disk under max_upload_bytes
