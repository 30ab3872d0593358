"""Wiring: the eval service definition (the one place its dependencies are built)."""

from whetstone.runtime.service import Service

from .adapters import repository
from .adapters.judges import EndpointJudge, LocalModelJudge, ModelSafetyClassifier
from .adapters.metrics import event_metrics
from .adapters.migrations import MIGRATIONS
from .config import EvalSettings
from .context import EvalContext
from .entrypoints import handlers
from .entrypoints.worker import eval_worker


def build_context(config: EvalSettings) -> EvalContext:
    judge = None
    if config.judge_url:
        judge = EndpointJudge(config.judge_url, config.judge_model, config.judge_api_key, config.judge_timeout_s,
                              sees_images=config.judge_sees_images)
    elif config.judge_local_model:
        judge = LocalModelJudge(config.judge_local_model)
    classifier = ModelSafetyClassifier(config.safety_classifier_model) if config.safety_classifier_model else None
    return EvalContext(config=config, judge=judge, safety_classifier=classifier)


def build_service(config: EvalSettings | None = None) -> Service[EvalContext]:
    config = config or EvalSettings()
    return Service(name="eval", migrations=MIGRATIONS, http_port=config.http_port, context=build_context(config),
                   subscriptions={"job.queued": handlers.on_job_queued,
                                  "checkpoint.written": handlers.on_checkpoint_written,
                                  "eval.requested": handlers.on_eval_requested,
                                  "node.fenced": handlers.on_node_fenced,
                                  "job.cancelled": handlers.on_job_cancelled},
                   background=[eval_worker] * max(1, config.workers), probes=repository.PROBES,
                   event_metrics=event_metrics)
