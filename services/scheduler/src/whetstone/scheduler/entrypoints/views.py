"""What the API shows: OpenAI's `fine_tuning.job`, `fine_tuning.job.event` and
`fine_tuning.job.checkpoint` objects, with the platform's extra facts beside OpenAI's fields
(`state` is the platform's finer status; `status` is one of OpenAI's values)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from whetstone.contracts import (
    TOLERANT, EvalCompletedV1, Hyperparameters, ReinforcementSpec, checkpoint_model_for, fine_tuned_model_for,
)
from whetstone.graders.rft import BASE_GENERATIONS, DEFAULT_LEARNING_RATE

from ..domain import jobs as rules
from ..domain.job import Job
from ..domain.job_data import CheckpointEntry, TimelineEntry
from ..domain.forecast import Forecast
from .job_object import (
    DpoHyperparameters, DpoMethod, EvalView, FineTuningJob, MethodObject, PreemptionRequest, Preemptions,
    ReinforcementHyperparameters, ReinforcementMethod, ResourcesView, SupervisedHyperparameters, SupervisedMethod,
    WhetstoneMethod,
)
from .requests import FAMILY


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
AUTO_KNOBS = ("n_epochs", "batch_size", "learning_rate", "lora_r", "lora_alpha")


def method_view(method: str, hp: Hyperparameters, given: Hyperparameters | None = None, *,
                reinforcement: ReinforcementSpec | None = None) -> MethodObject:
    """OpenAI's method object of a job. `batch_size` is OpenAI's: examples per optimizer step (micro-batch x
    gradient accumulation); `micro_batch_size` the platform's split of it; `auto` the knobs admission chose
    (the set ones the request left out or asked `auto`); a reinforcement job shows its `reinforcement`
    object instead, and `whetstone.method` `qlora` when its base is loaded in 4 bits."""
    family = FAMILY.get(method, "supervised")
    if family == "reinforcement":
        quantized = reinforcement is not None and reinforcement.base_quantization == "nf4"
        return MethodObject(type="reinforcement", reinforcement=reinforcement_view(reinforcement),
                            whetstone=WhetstoneMethod(method="qlora" if quantized else method))
    default_lr = rules.default_learning_rate(method)   # none for a merge job
    micro, accumulation = hp.batch_size, hp.gradient_accumulation_steps or 1
    set_knobs, auto = hp.model_dump(exclude_none=True), None
    if given is not None and set_knobs:
        asked = given.model_dump(exclude_none=True)
        auto = [k for k in AUTO_KNOBS if k in set_knobs and asked.get(k, "auto") == "auto"]
    shown = SupervisedHyperparameters(
        n_epochs=hp.n_epochs, batch_size=micro * accumulation if isinstance(micro, int) else micro,
        learning_rate_multiplier=round(hp.learning_rate / default_lr, 6) if hp.learning_rate and default_lr else None,
        micro_batch_size=micro, learning_rate=hp.learning_rate, lora_r=hp.lora_r, lora_alpha=hp.lora_alpha,
        gradient_accumulation_steps=hp.gradient_accumulation_steps, gradient_checkpointing=hp.gradient_checkpointing,
        max_seq_len=hp.max_seq_len, auto=auto)
    whetstone = WhetstoneMethod(method=method)
    if family == "dpo":
        return MethodObject(type="dpo", dpo=DpoMethod(hyperparameters=DpoHyperparameters(**dict(shown), beta=hp.beta)),
                            whetstone=whetstone)
    return MethodObject(type="supervised", supervised=SupervisedMethod(hyperparameters=shown), whetstone=whetstone)


def reinforcement_view(spec: ReinforcementSpec | None) -> ReinforcementMethod:
    """`method.reinforcement` of a job (its request's reinforcement object) as OpenAI's `fine_tuning.job` shows it."""
    if spec is None:
        return ReinforcementMethod(grader=None, hyperparameters=ReinforcementHyperparameters())
    shown = ReinforcementHyperparameters(
        n_epochs=spec.n_epochs, batch_size=spec.batch_size,
        learning_rate_multiplier=round(spec.learning_rate / DEFAULT_LEARNING_RATE, 6),
        compute_multiplier=spec.generations / BASE_GENERATIONS, eval_interval=spec.eval_interval,
        eval_samples=spec.eval_samples, reasoning_effort=spec.reasoning_effort)
    return ReinforcementMethod(grader=spec.grader, hyperparameters=shown, response_format=spec.response_format or None)


def job_view(job: Job, queue: Forecast | None = None) -> FineTuningJob:
    req, spec, res = job.request, job.spec, job.resources
    given = req.hyperparameters
    resolved = Hyperparameters.model_validate(spec.hyperparameters, context=TOLERANT) if spec is not None else None
    hp = resolved if resolved is not None and spec is not None and spec.hyperparameters else given
    method = method_view(job.method, hp, given, reinforcement=req.reinforcement)
    estimated_start = None
    if job.status == rules.QUEUED and queue is not None and queue.estimated_start is not None:
        estimated_start = int(queue.estimated_start)
    if job.on_node and job.est_end_at:
        finish = ts(job.est_end_at)
    elif estimated_start is not None and job.estimated_runtime_s:
        finish = estimated_start + int(job.estimated_runtime_s)
    else:
        finish = None
    return FineTuningJob(
        id=job.job_id, organization_id=job.tenant_id, model=req.model, training_file=req.training_file,
        validation_file=req.validation_file, status=job.public_status, created_at=ts(job.created_at),
        finished_at=ts(job.finished_at), fine_tuned_model=job.fine_tuned_model, result_files=list(job.result_files),
        trained_tokens=job.trained_tokens, hyperparameters=method.hyperparameters, method=method, seed=hp.seed,
        estimated_finish=finish, error=job.error, metadata=req.metadata, integrations=list(req.integrations),
        user_provided_suffix=req.suffix, template=req.template,
        state=job.status, tier=job.tier, tenant_id=job.tenant_id, resolved_hyperparameters=resolved,
        base_model_sha256=job.base_model_sha256, dataset_version=spec.dataset_version if spec is not None else None,
        eval_config=req.eval_config, image=req.image, progress=job.progress, latest_checkpoint=job.latest_checkpoint,
        node_id=job.node_id, placement=list(job.placement), attempt=job.attempt,
        fenced_attempt=job.fenced_attempt or None, timeouts=job.timeouts, eval=eval_view(job.eval),
        idempotency_key=job.idempotency_key, trace_id=job.trace_id,
        resources=ResourcesView(request=res.request, shapes=res.shapes, memory_gb=res.memory_gb, params=res.params,
                                params_source=res.params_source, assigned=res.assigned),
        estimated_runtime_s=job.estimated_runtime_s, quota=job.quota,
        preemptions=Preemptions(spot=job.spot_preemptions, priority=job.priority_preemptions),
        preemption_requested=PreemptionRequest(at=ts(job.preempt_requested_at), reason=job.preempt_reason,
                                               for_job=job.preempted_for) if job.preempt_requested_at else None,
        queue_position=queue.position if job.status == rules.QUEUED and queue is not None else None,
        estimated_start_at=estimated_start)


def eval_view(result: EvalCompletedV1 | None) -> EvalView | None:
    if result is None:
        return None
    return EvalView(checkpoint_uri=result.checkpoint_uri, verdict=result.verdict, reasons=result.reasons,
                    metrics=result.metrics, stages=result.stages)


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
