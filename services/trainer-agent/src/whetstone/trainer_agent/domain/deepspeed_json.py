"""DeepSpeed's own config as the agent writes it (`distributed.deepspeed_config`) and the training child
reads it (`TrainingConfig.deepspeed`, recipes/spec.py). Pure.

The keys the platform writes or reads are typed; the child reads tolerantly, so any other DeepSpeed
key is kept as written and a config given inline passes through to DeepSpeed whole. Only the keys
given are written back: the JSON handed to DeepSpeed is the one its producer built, key for key.
"auto" values are filled in by the HF Trainer from its TrainingArguments.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, JsonValue
from whetstone.contracts.base import GivenFieldsOnly

Auto = Literal["auto"]


class DeepSpeedSection(GivenFieldsOnly):
    """A part of DeepSpeed's config: typed keys, other keys kept (when read tolerantly), given keys only
    written back."""

    model_config = ConfigDict(extra="allow")


class Offload(DeepSpeedSection):
    device: Literal["cpu", "nvme", "none"]
    pin_memory: bool = False


class ZeroOptimization(DeepSpeedSection):
    stage: int | None = Field(default=None, ge=0, le=3)
    overlap_comm: bool | None = None
    contiguous_gradients: bool | None = None
    reduce_bucket_size: int | Auto | None = None
    stage3_prefetch_bucket_size: int | Auto | None = None
    stage3_param_persistence_threshold: int | Auto | None = None
    stage3_gather_16bit_weights_on_model_save: bool | None = None   # save_model writes whole weights
    offload_optimizer: Offload | None = None
    offload_param: Offload | None = None


class Precision(DeepSpeedSection):
    enabled: bool | Auto


class OptimizerParams(DeepSpeedSection):
    lr: float | Auto | None = None
    betas: list[float] | Auto | None = None
    eps: float | Auto | None = None
    weight_decay: float | Auto | None = None


class Optimizer(DeepSpeedSection):
    type: str
    params: OptimizerParams | None = None


class DeepSpeedConfig(DeepSpeedSection):
    train_micro_batch_size_per_gpu: int | Auto | None = None
    gradient_accumulation_steps: int | Auto | None = None
    train_batch_size: int | Auto | None = None
    gradient_clipping: int | float | Auto | None = None
    bf16: Precision | None = None
    fp16: Precision | None = None
    zero_optimization: ZeroOptimization | None = None
    steps_per_print: int | None = None
    wall_clock_breakdown: bool | None = None
    optimizer: Optimizer | None = None

    @property
    def zero_stage(self) -> int | None:
        return self.zero_optimization.stage if self.zero_optimization else None

    def document(self) -> dict[str, JsonValue]:
        """The JSON object DeepSpeed (and transformers' HfDeepSpeedConfig) is given."""
        written: dict[str, JsonValue] = self.model_dump(mode="json")
        return written
