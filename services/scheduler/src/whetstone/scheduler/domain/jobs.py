"""Job state machine, admission rules and spec resolution. Pure: no IO."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pydantic import BaseModel
from whetstone.contracts import Hyperparameters
from whetstone.contracts.enums import JobStatus

# OpenAI-style statuses plus the platform's own (contracts.enums.JobStatus).
VALIDATING = JobStatus.VALIDATING_FILES
QUEUED = JobStatus.QUEUED
PROVISIONING = JobStatus.PROVISIONING
RUNNING = JobStatus.RUNNING
CHECKPOINTING = JobStatus.CHECKPOINTING
EVALUATING = JobStatus.EVALUATING
PREEMPTED = JobStatus.PREEMPTED
PAUSED = JobStatus.PAUSED
SUCCEEDED = JobStatus.SUCCEEDED
FAILED = JobStatus.FAILED
CANCELLED = JobStatus.CANCELLED

TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE_ON_NODE = frozenset({PROVISIONING, RUNNING, CHECKPOINTING})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    VALIDATING: frozenset({QUEUED, FAILED, CANCELLED}),
    QUEUED: frozenset({PROVISIONING, PAUSED, FAILED, CANCELLED}),
    PROVISIONING: frozenset({RUNNING, EVALUATING, PREEMPTED, FAILED, CANCELLED}),
    RUNNING: frozenset({CHECKPOINTING, EVALUATING, PREEMPTED, FAILED, CANCELLED}),
    CHECKPOINTING: frozenset({RUNNING, EVALUATING, PREEMPTED, FAILED, CANCELLED}),
    PREEMPTED: frozenset({QUEUED, PAUSED, FAILED, CANCELLED}),
    PAUSED: frozenset({QUEUED, FAILED, CANCELLED}),      # resumed: back in the queue
    EVALUATING: frozenset({SUCCEEDED, FAILED, CANCELLED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}


class InvalidTransition(ValueError):
    pass


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in TRANSITIONS.get(current, frozenset())


def transition(current: JobStatus, target: JobStatus) -> JobStatus:
    if not can_transition(current, target):
        raise InvalidTransition(f"job cannot go from {current} to {target}")
    return target


# ------------------------------------------------------------------ admission

TIER_PRIORITY = {"premium": 0, "standard": 1, "free": 2}


@dataclass(frozen=True)
class Rejection:
    code: str
    message: str
    param: str | None = None    # the request field at fault (OpenAI's error.param)


def check_tenant(tenant_id: str, tenants: dict[str, str], requested_tier: str | None) -> Rejection | str:
    """Returns the tier the job runs at, or why it is refused."""
    tier = tenants.get(tenant_id)
    if tier is None:
        return Rejection("unknown_tenant", f"tenant {tenant_id!r} is not registered on this platform")
    if requested_tier and requested_tier != tier:
        if TIER_PRIORITY.get(requested_tier, -1) < TIER_PRIORITY[tier]:
            return Rejection("tier_not_allowed", f"tenant {tenant_id!r} has tier {tier!r}, not {requested_tier!r}")
        return requested_tier  # running at a lower tier than allowed is fine
    return tier


def request_fingerprint(request: BaseModel) -> str:
    """Stripe semantics: same key + same parameters = same job; different = error. The hash of the
    request's set fields as sorted JSON."""
    fields = request.model_dump(mode="json", exclude_none=True)
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


# -------------------------------------------------------- spec resolution

METHOD_DEFAULTS: dict[str, Hyperparameters] = {
    "lora": Hyperparameters(learning_rate=2e-4, lora_r=16, lora_dropout=0.05),
    "qlora": Hyperparameters(learning_rate=2e-4, lora_r=16, lora_dropout=0.05),
    "full": Hyperparameters(learning_rate=2e-5),
    "dpo": Hyperparameters(learning_rate=5e-6, lora_r=16, lora_dropout=0.05),
    "orpo": Hyperparameters(learning_rate=8e-6, lora_r=16, lora_dropout=0.05),
    "cpt": Hyperparameters(learning_rate=2e-5),
}
COMMON_DEFAULTS = Hyperparameters(n_epochs=3, batch_size=8, gradient_accumulation_steps=1, max_seq_len=2048,
                                  warmup_ratio=0.03, seed=42, checkpoint_every_steps=50)
METHODS_FOR_PURPOSE: dict[str, frozenset[str]] = {
    "sft": frozenset({"lora", "qlora", "full"}), "dpo": frozenset({"dpo", "orpo"}), "cpt": frozenset({"cpt"}),
    "eval": frozenset(), "rft": frozenset({"reinforcement"})}
# the data's schema as ingest detected it (dataset.validated `data_schema`) decides before the declared purpose
SUPERVISED = frozenset({"lora", "qlora", "full"})
METHODS_FOR_SCHEMA = {"chat": SUPERVISED, "prompt_completion": SUPERVISED, "instruction": SUPERVISED,
                      "preference": frozenset({"dpo", "orpo"}), "text": frozenset({"cpt"})}
NEEDS = {"dpo": "a preference dataset (chosen/rejected or preferred_output/non_preferred_output pairs)",
         "orpo": "a preference dataset (chosen/rejected or preferred_output/non_preferred_output pairs)",
         "cpt": "plain text rows", "lora": "chat, prompt/completion or instruction rows",
         "qlora": "chat, prompt/completion or instruction rows", "full": "chat, prompt/completion or instruction rows",
         "reinforcement": "an rft dataset (rows whose messages end with a user turn, with the fields the grader reads)"}
# what a file's rows look like, by the schema ingest detected from its first line (the file's rows share it)
ROW_SHAPES = {"chat": 'rows of {"messages": [...]}', "prompt_completion": 'rows of {"prompt", "completion"}',
              "instruction": 'rows of {"instruction", "output"}', "text": 'rows of {"text": ...} documents',
              "preference": "rows of preferred/non-preferred pairs"}
DEFAULT_MAX_SEQ_LEN = 2048


def model_defaults(max_positions: int | None) -> Hyperparameters:
    """Defaults fitted to the base model: the sequence length never exceeds its context."""
    if max_positions and max_positions < DEFAULT_MAX_SEQ_LEN:
        return Hyperparameters(max_seq_len=int(max_positions))
    return Hyperparameters()


def default_learning_rate(method: str) -> float | None:
    """The method's default rate (None for a method without one, e.g. a merge)."""
    defaults = METHOD_DEFAULTS.get(method)
    return defaults.learning_rate if defaults else None


def hyperparameters_hash(hp: Hyperparameters) -> str:
    """The lineage hash of resolved hyperparameters: sha256 of their set fields as sorted JSON."""
    return hashlib.sha256(json.dumps(hp.model_dump(exclude_none=True), sort_keys=True).encode()).hexdigest()


def resolve_hyperparameters(method: str, given: Hyperparameters, model_defaults: Hyperparameters | None = None
                            ) -> tuple[Hyperparameters, str]:
    """Fill unset knobs with per-method (and per-model) defaults; alpha = 2 x rank.
    Returns the resolved hyperparameters and their hash (lineage)."""
    layers = (COMMON_DEFAULTS, METHOD_DEFAULTS.get(method), model_defaults, given)   # later ones win
    resolved = Hyperparameters.model_validate(
        {k: v for layer in layers if layer is not None for k, v in layer.model_dump(exclude_none=True).items()})
    if resolved.lora_r is not None and given.lora_alpha is None:
        resolved = resolved.model_copy(update={"lora_alpha": 2 * resolved.lora_r})
    return resolved, hyperparameters_hash(resolved)


def check_method_fits_dataset(method: str, purpose: str, schema: str | None = None,
                              dataset_id: str = "the training file", param: str = "training_file") -> Rejection | None:
    """The method against the data (the file named by `param`): by its detected schema when known,
    else its declared purpose."""
    if schema in METHODS_FOR_SCHEMA:
        allowed, holds = METHODS_FOR_SCHEMA[schema], f"{schema} data (from line 1 on, {ROW_SHAPES[schema]})"
    else:
        allowed, holds = METHODS_FOR_PURPOSE.get(purpose, frozenset()), f"a {str(purpose)!r} dataset"
    if method not in allowed:
        return Rejection("method_dataset_mismatch",
                         f"method {str(method)!r} needs {NEEDS.get(method, 'another kind of data')}; {param} "
                         f"{dataset_id} holds {holds} (fits: {', '.join(sorted(allowed)) or 'nothing: eval-only data'})",
                         param=param)
    return None


ADAPTER_METHODS = frozenset({"lora", "qlora", "dpo", "orpo"})


def check_hyperparameters(method: str, given: Hyperparameters, hidden_size: int | None,
                          max_positions: int | None) -> Rejection | None:
    """What the contract's per-field ranges cannot see: knobs that make no sense for this
    method or exceed what the base model can do."""
    lora_knobs = (("lora_r", given.lora_r), ("lora_alpha", given.lora_alpha), ("lora_dropout", given.lora_dropout))
    set_knobs = [name for name, value in lora_knobs if value is not None]
    if method not in ADAPTER_METHODS and set_knobs:
        return Rejection("hyperparameter_out_of_range",
                         f"{', '.join(set_knobs)} only apply to adapter methods (lora, qlora, dpo, orpo), "
                         f"not {str(method)!r}", param=f"hyperparameters.{set_knobs[0]}")
    r = given.lora_r
    if r is not None and hidden_size and r > hidden_size:
        return Rejection("hyperparameter_out_of_range",
                         f"hyperparameters.lora_r={r} exceeds the base model's hidden size ({hidden_size})",
                         param="hyperparameters.lora_r")
    seq = given.max_seq_len
    if seq is not None and max_positions and seq > max_positions:
        return Rejection("hyperparameter_out_of_range",
                         f"hyperparameters.max_seq_len={seq} exceeds the base model's context length "
                         f"(max_position_embeddings {max_positions}): use at most {max_positions}, or leave it "
                         "out to get the model's limit", param="hyperparameters.max_seq_len")
    return None
