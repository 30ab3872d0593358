"""What the API shows: OpenAI's `fine_tuning.job`, `fine_tuning.job.event` and
`fine_tuning.job.checkpoint` objects, with the platform's extra facts beside OpenAI's fields
(`state` is the platform's finer status; `status` is one of OpenAI's values)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from whetstone.contracts import TOLERANT, EvalCompletedV1, Hyperparameters, checkpoint_model_for, fine_tuned_model_for
from whetstone.contracts.enums import Method

from ..domain import jobs as rules
from ..domain.job import Job
from ..domain.job_data import CheckpointEntry, TimelineEntry
from ..domain.forecast import Forecast
from .requests import FAMILY
from ..usecases.rft import reinforcement_view

OPENAI_HP = ("n_epochs", "batch_size", "learning_rate_multiplier", "beta")


def ts(t: datetime | None) -> int | None:
    return int(t.timestamp()) if t else None


def event_id(n: int) -> str:
    return f"ftevent-{n}"


def parse_event_id(value: str | None) -> int | None:
    if not value:
        return None
    digits = value.removeprefix("ftevent-")
    return int(digits) if digits.isdigit() else -1


# resolved knobs echoed beside OpenAI's three (the client keeps them as extra fields)
ECHOED = ("learning_rate", "lora_r", "lora_alpha", "gradient_accumulation_steps", "gradient_checkpointing",
          "max_seq_len")


AUTO_KNOBS = ("n_epochs", "batch_size", "learning_rate", "lora_r", "lora_alpha")


def method_view(method: str, hp: Hyperparameters, given: Hyperparameters | None = None, *,
                extra: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(the family, OpenAI's method object). `batch_size` is OpenAI's: examples per optimizer step (micro-batch x
    gradient accumulation); `micro_batch_size` the platform's split of it; `auto` the knobs admission chose;
    `extra` the entries added after the family's (a reinforcement job's `reinforcement`, `whetstone`)."""
    family = FAMILY.get(method, "supervised")
    default_lr = rules.default_learning_rate(method)   # none for a merge job
    micro, accumulation = hp.batch_size, hp.gradient_accumulation_steps or 1
    set_knobs = hp.model_dump(exclude_none=True)
    asked = given.model_dump(exclude_none=True) if given is not None else None
    chosen = {"auto": [k for k in AUTO_KNOBS if k in set_knobs and asked.get(k, "auto") == "auto"]} \
        if asked is not None and set_knobs else {}
    shown = {"n_epochs": hp.n_epochs,
             "batch_size": micro * accumulation if isinstance(micro, int) else micro,
             "learning_rate_multiplier": round(hp.learning_rate / default_lr, 6)
             if hp.learning_rate and default_lr else None,
             "micro_batch_size": micro, **{k: set_knobs[k] for k in ECHOED if k in set_knobs}, **chosen,
             **({"beta": hp.beta} if family == "dpo" else {})}
    return family, {"type": family, family: {"hyperparameters": shown}, "whetstone": {"method": method},
                    **(extra or {})}


def job_view(job: Job, queue: Forecast | None = None) -> dict[str, Any]:
    req, spec, res = job.request, job.spec, job.resources
    given = req.hyperparameters
    hp = Hyperparameters.model_validate(spec.hyperparameters, context=TOLERANT) \
        if spec is not None and spec.hyperparameters else given
    extra: dict[str, Any] = {}
    if job.method == Method.REINFORCEMENT:
        extra = {"reinforcement": reinforcement_view(req.reinforcement)}
        if req.reinforcement is not None and req.reinforcement.base_quantization == "nf4":
            extra = {"whetstone": {"method": "qlora"}, **extra}   # as requested: LoRA on a 4-bit base
    family, method = method_view(job.method, hp, given, extra=extra)
    estimated_start = None
    if job.status == rules.QUEUED and queue is not None and queue.estimated_start is not None:
        estimated_start = int(queue.estimated_start)
    if job.on_node and job.est_end_at:
        finish = ts(job.est_end_at)
    elif estimated_start is not None and job.estimated_runtime_s:
        finish = estimated_start + int(job.estimated_runtime_s)
    else:
        finish = None
    error = job.error.model_dump(mode="json") if job.error is not None else None
    return {
        # OpenAI's fine_tuning.job
        "id": job.job_id, "object": "fine_tuning.job", "organization_id": job.tenant_id,
        "model": req.model, "training_file": req.training_file, "validation_file": req.validation_file,
        "status": job.public_status, "created_at": ts(job.created_at), "finished_at": ts(job.finished_at),
        "fine_tuned_model": job.fine_tuned_model, "result_files": list(job.result_files), "trained_tokens": job.trained_tokens,
        "hyperparameters": method[family]["hyperparameters"], "method": method, "seed": hp.seed, "estimated_finish": finish,
        "error": error, "metadata": req.metadata,
        "integrations": [i.model_dump(mode="json", exclude_none=True) for i in req.integrations],
        "user_provided_suffix": req.suffix, "template": req.template.model_dump() if req.template else None,
        # the platform's own
        "state": job.status, "tier": job.tier, "tenant_id": job.tenant_id,
        "resolved_hyperparameters": spec.hyperparameters if spec is not None else None,
        "base_model_sha256": job.base_model_sha256, "dataset_version": spec.dataset_version if spec is not None else None,
        "eval_config": req.eval_config, "image": req.image,
        "progress": job.progress.model_dump(exclude_none=True),
        "latest_checkpoint": job.latest_checkpoint.model_dump(mode="json", exclude_none=True)
        if job.latest_checkpoint is not None else None,
        "node_id": job.node_id, "placement": [p.model_dump() for p in job.placement], "attempt": job.attempt,
        "fenced_attempt": job.fenced_attempt or None, "timeouts": job.timeouts,
        "eval": eval_view(job.eval), "idempotency_key": job.idempotency_key, "trace_id": job.trace_id,
        "resources": res.model_dump(mode="json", include={"request", "shapes", "assigned", "memory_gb", "params",
                                                          "params_source"}),
        "estimated_runtime_s": job.estimated_runtime_s, "quota": job.quota.model_dump() if job.quota else None,
        "preemptions": {"spot": job.spot_preemptions, "priority": job.priority_preemptions},
        "preemption_requested": {"at": ts(job.preempt_requested_at), "reason": job.preempt_reason,
                                 "for_job": job.preempted_for} if job.preempt_requested_at else None,
        "queue_position": queue.position if job.status == rules.QUEUED and queue is not None else None,
        "estimated_start_at": estimated_start,
    }


def eval_view(result: EvalCompletedV1 | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return result.model_dump(mode="json", include={"verdict", "reasons", "stages", "metrics", "checkpoint_uri"})


class EventObject(BaseModel):
    """OpenAI's `fine_tuning.job.event`."""
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int | None
    level: str
    message: str
    type: str
    data: dict[str, Any]   # the timeline line's JSON facts (metrics, reasons), as stored


def event_view(e: TimelineEntry) -> EventObject:
    return EventObject(id=event_id(e.id), created_at=ts(e.created_at), level=e.level, message=e.message, type=e.type,
                       data=e.data)


# stored checkpoint metric -> OpenAI's names. The platform validates on the whole validation file at
# every checkpoint, so its validation figures are both OpenAI's batch (`valid_*`) and full (`full_valid_*`) ones.
CHECKPOINT_METRIC_NAMES = {
    "train_loss": ("train_loss",), "token_accuracy": ("train_mean_token_accuracy",),
    "train_mean_token_accuracy": ("train_mean_token_accuracy",),
    "validation_loss": ("valid_loss", "full_valid_loss"),
    "validation_mean_token_accuracy": ("valid_mean_token_accuracy", "full_valid_mean_token_accuracy"),
}


Metric = int | float | None


def checkpoint_metrics(step: int, stored: Mapping[str, float] | None) -> dict[str, Metric]:
    """OpenAI's `fine_tuning.job.checkpoint.metrics`: step, train_loss, train_mean_token_accuracy, valid_loss,
    valid_mean_token_accuracy, full_valid_loss, full_valid_mean_token_accuracy (None where not measured)."""
    out: dict[str, Metric] = {"step": step, "train_loss": None, "train_mean_token_accuracy": None, "valid_loss": None,
                           "valid_mean_token_accuracy": None, "full_valid_loss": None,
                           "full_valid_mean_token_accuracy": None}
    for key, value in (stored or {}).items():
        for name in CHECKPOINT_METRIC_NAMES.get(key, (key,)):
            if out.get(name) is None:
                out[name] = value
    return out


def model_name_of(job: Job) -> str:
    """The job's `fine_tuned_model`: the registry's once it announced it, else the same name computed ahead
    (naming.fine_tuned_model_for), so checkpoint names are stable from the first checkpoint on."""
    base = job.base_model or job.request.model
    return job.fine_tuned_model or fine_tuned_model_for(base, job.tenant_id, job.request.suffix, job.job_id)


class CheckpointObject(BaseModel):
    """OpenAI's `fine_tuning.job.checkpoint`, with the platform's kind and storage uri."""
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int | None
    fine_tuning_job_id: str
    step_number: int
    metrics: dict[str, Metric]
    fine_tuned_model_checkpoint: str
    kind: str
    uri: str


def checkpoint_view(job: Job, c: CheckpointEntry) -> CheckpointObject:
    return CheckpointObject(id=c.checkpoint_id, created_at=ts(c.created_at), fine_tuning_job_id=job.job_id,
                            step_number=c.step, metrics=checkpoint_metrics(c.step, c.metrics),
                            fine_tuned_model_checkpoint=checkpoint_model_for(model_name_of(job), c.step),
                            kind=c.kind, uri=c.uri)
