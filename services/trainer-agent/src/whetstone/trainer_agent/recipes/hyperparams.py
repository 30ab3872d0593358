"""Hyperparameters: parsing, validation (user errors, before any training), defaults.

Pure: no torch. The scheduler resolves most defaults; the recipe still validates every
value it receives and fills what only it can know (model size, data lengths):

- learning rate by method: LoRA/QLoRA 2e-4, full/CPT 2e-5, DPO 5e-6, ORPO 8e-6;
- LoRA rank by model size (`rank_for_size`), alpha = 2 x rank, all linear layers;
- cosine schedule with 3% warm-up (warmup_ratio);
- batch_size "auto": a micro-batch that fits a token budget, and as much gradient
  accumulation as needed to reach `target_effective_batch`.

A value counts as the user's (and is never replaced) when it is present in the raw dict.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from whetstone.contracts.enums import Method

from .errors import UserError

log = logging.getLogger("whetstone.trainer_agent.recipes")

# train a LoRA adapter on a frozen base
ADAPTER_METHODS = frozenset({Method.LORA, Method.QLORA, Method.DPO, Method.ORPO, Method.REINFORCEMENT})
PREFERENCE_METHODS = frozenset({Method.DPO, Method.ORPO})
LEARNING_RATE_BY_METHOD = {Method.LORA: 2e-4, Method.QLORA: 2e-4, Method.FULL: 2e-5, Method.CPT: 2e-5,
                           Method.DPO: 5e-6, Method.ORPO: 8e-6, Method.REINFORCEMENT: 1e-5}
RANK_BY_SIZE = ((1e9, 8), (10e9, 16), (40e9, 32))  # (params below, rank); larger models: 64
AUTO = "auto"


def rank_for_size(n_params: int) -> int:
    for limit, rank in RANK_BY_SIZE:
        if n_params < limit:
            return rank
    return 64


@dataclass(frozen=True)
class Hyperparameters:
    # Defaults are tuned for the demo (tiny random Llama, chat_demo.jsonl, CPU); the
    # scheduler resolves per-base-model hyperparameters for real jobs.
    n_epochs: int = 2
    learning_rate: float = 1e-2
    batch_size: int | str = 8  # micro-batch per device, or "auto"
    gradient_accumulation_steps: int = 1
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    max_seq_len: int = 256
    seed: int = 0
    checkpoint_every_steps: int = 50  # 0 = no step cadence
    warmup_ratio: float = 0.05
    # --- added by the recipe (all optional)
    checkpoint_every_minutes: float = 30.0  # 0 = no time cadence; whichever of steps/minutes comes first
    packing: bool = True  # padding-free: a micro-batch is one row, positions reset per example
    lora_target_modules: tuple[str, ...] | None = None  # None = every linear layer but the output head
    merge_adapter: bool = False  # also write final/merged (merge_and_unload)
    precompute_ref_log_probs: bool = True  # DPO: reference log-probs computed once, kept with the checkpoints
    beta: float = 0.1  # DPO beta / ORPO lambda
    target_effective_batch: int = 16  # with batch_size "auto"
    micro_batch_tokens: int = 0  # token budget of an "auto" micro-batch; 0 = by device
    max_oom_retries: int = 3  # halve the micro-batch (double accumulation) this many times
    divergence_factor: float = 4.0  # loss > factor x running minimum for `divergence_patience` steps; 0 = off
    divergence_patience: int = 3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = False
    train_vision_tower: bool = False  # vision bases: LoRA also on the vision tower and projector (default frozen)
    explicit: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def effective_batch(self) -> int:
        return int(self.batch_size) * self.gradient_accumulation_steps

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Hyperparameters:
        known = {f.name for f in fields(cls)} - {"explicit"}
        unknown = sorted(set(raw) - known)
        if unknown:
            log.warning("ignoring unknown hyperparameters: %s", ", ".join(unknown))
        values = {name: _coerce(name, raw[name]) for name in known if raw.get(name) is not None}
        hp = cls(**values, explicit=frozenset(values))
        hp.validate()
        return hp

    def validate(self) -> None:
        bad = [f"{name}={getattr(self, name)!r} (must be {rule})" for name, (rule, ok) in _RULES.items()
               if not ok(getattr(self, name))]
        if self.lora_target_modules is not None and not self.lora_target_modules:
            bad.append("lora_target_modules=() (must name at least one module)")
        if bad:
            raise UserError("invalid hyperparameters: " + ", ".join(bad), code="invalid_hyperparameters")

    def resolved(self, method: str, n_params: int) -> Hyperparameters:
        """Fill the method- and size-dependent defaults the user did not set."""
        given = self.explicit
        learning_rate = self.learning_rate if "learning_rate" in given else LEARNING_RATE_BY_METHOD[method]
        lora_r = self.lora_r if "lora_r" in given else rank_for_size(n_params)
        lora_alpha = self.lora_alpha if "lora_alpha" in given else 2 * lora_r
        return replace(self, learning_rate=learning_rate, lora_r=lora_r, lora_alpha=lora_alpha)

    def with_batch(self, micro_batch: int, accumulation: int) -> Hyperparameters:
        return replace(self, batch_size=micro_batch, gradient_accumulation_steps=accumulation)


_INT = {"n_epochs", "gradient_accumulation_steps", "lora_r", "lora_alpha", "max_seq_len", "seed",
        "checkpoint_every_steps", "target_effective_batch", "micro_batch_tokens", "max_oom_retries",
        "divergence_patience"}
_FLOAT = {"learning_rate", "lora_dropout", "warmup_ratio", "checkpoint_every_minutes", "beta",
          "divergence_factor", "weight_decay", "max_grad_norm"}
_BOOL = {"packing", "merge_adapter", "precompute_ref_log_probs", "gradient_checkpointing", "train_vision_tower"}

_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {  # name -> (what it must be, check)
    "n_epochs": ("1..100", lambda v: 1 <= v <= 100),
    "learning_rate": ("> 0 and < 1", lambda v: 0 < v < 1),
    "batch_size": ("1..4096 or 'auto'", lambda v: v == AUTO or 1 <= v <= 4096),
    "gradient_accumulation_steps": ("1..1024", lambda v: 1 <= v <= 1024),
    "lora_r": ("1..1024", lambda v: 1 <= v <= 1024),
    "lora_alpha": ("1..4096", lambda v: 1 <= v <= 4096),
    "lora_dropout": (">= 0 and < 1", lambda v: 0 <= v < 1),
    "max_seq_len": ("8..131072", lambda v: 8 <= v <= 131072),
    "seed": (">= 0", lambda v: v >= 0),
    "checkpoint_every_steps": (">= 0", lambda v: v >= 0),
    "warmup_ratio": (">= 0 and < 1", lambda v: 0 <= v < 1),
    "checkpoint_every_minutes": (">= 0", lambda v: v >= 0),
    "beta": ("> 0 and <= 10", lambda v: 0 < v <= 10),
    "target_effective_batch": ("1..4096", lambda v: 1 <= v <= 4096),
    "micro_batch_tokens": (">= 0", lambda v: v >= 0),
    "max_oom_retries": ("0..10", lambda v: 0 <= v <= 10),
    "divergence_factor": ("0 (off) or > 1", lambda v: v == 0 or v > 1),
    "divergence_patience": ("1..1000", lambda v: 1 <= v <= 1000),
    "weight_decay": (">= 0 and < 1", lambda v: 0 <= v < 1),
    "max_grad_norm": (">= 0", lambda v: v >= 0),
}


def _coerce(name: str, value: Any) -> Any:
    def wrong(kind: str) -> UserError:
        return UserError(f"hyperparameter {name} must be {kind}, got {value!r}", code="invalid_hyperparameters")

    if name == "batch_size" and value == AUTO:
        return AUTO
    if name in _BOOL:
        if not isinstance(value, bool):
            raise wrong("a boolean")
        return value
    if name == "lora_target_modules":
        if value == "all-linear":
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise wrong("a list of module names or 'all-linear'")
        return tuple(sorted(set(value)))
    kind = float if name in _FLOAT else int
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise wrong("int" if kind is int else "float")
    if kind is int and value != int(value):
        raise wrong("int")
    return kind(value)


# ------------------------------------------------------------------ batch size "auto"


def plan_auto_batch(target_effective: int, example_lengths: list[int], token_budget: int) -> tuple[int, int]:
    """(micro-batch, accumulation) reaching `target_effective` examples per optimizer step.

    The micro-batch is the largest power of two whose worst case (95th-percentile length
    x micro-batch) fits the token budget, capped by the target; accumulation makes up the
    rest, rounding the effective batch up to a multiple of the micro-batch.
    """
    lengths = sorted(example_lengths) or [1]
    p95 = lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))]
    micro = 1
    while micro * 2 <= target_effective and micro * 2 * p95 <= token_budget:
        micro *= 2
    return micro, math.ceil(target_effective / micro)


def plan_batch(hp: Hyperparameters, example_lengths: list[int], token_budget: int,
               previous: tuple[int, int] | None) -> Hyperparameters:
    """The batch geometry of this segment: "auto" planned from the data, then the geometry of the
    checkpoint we resume from when its effective batch is the same (the segment before us may
    have halved its micro-batch after running out of memory)."""
    if hp.batch_size == AUTO:
        hp = hp.with_batch(*plan_auto_batch(hp.target_effective_batch, example_lengths or [hp.max_seq_len],
                                            token_budget))
        log.info("batch_size auto: micro-batch %d x accumulation %d", hp.batch_size, hp.gradient_accumulation_steps)
    if previous and previous[0] * previous[1] == hp.effective_batch:
        hp = hp.with_batch(*previous)
    return hp


def halved_batch(hp: Hyperparameters) -> Hyperparameters | None:
    """Half the micro-batch, twice the accumulation: the same effective batch. None at 1.

    An odd micro-batch cannot be halved exactly; it drops to 1 with all of it accumulated."""
    micro, accumulation = int(hp.batch_size), hp.gradient_accumulation_steps
    if micro < 2:
        return None
    if micro % 2:
        return replace(hp, batch_size=1, gradient_accumulation_steps=accumulation * micro)
    return replace(hp, batch_size=micro // 2, gradient_accumulation_steps=accumulation * 2)
