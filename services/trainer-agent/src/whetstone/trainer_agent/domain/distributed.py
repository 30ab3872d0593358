"""How a segment is spread over GPUs: ZeRO stage, zero_init, DeepSpeed config. Pure.

The rules, in the order `plan_distributed` applies them:

| situation                                   | decision                                        |
|---------------------------------------------|-------------------------------------------------|
| CPU node                                    | one plain process, no DeepSpeed                 |
| several CPU nodes (one process each)        | DDP over gloo, no DeepSpeed                     |
| QLoRA and ZeRO-3 (asked or needed)          | rejected: ZeRO-3 shards the 4-bit weights that  |
|                                             | bitsandbytes kernels need whole                 |
| one GPU, model state fits                   | one plain process, no DeepSpeed                 |
| one GPU, full fine-tune does not fit        | ZeRO-3 with optimizer + parameter CPU offload   |
| several GPUs, LoRA / QLoRA                  | ZeRO-2 (ZeRO-1 or -2 on request): adapter grads |
|                                             | and optimizer sharded, frozen base replicated   |
| several GPUs, LoRA, frozen base too big     | ZeRO-3 (base weights sharded too)               |
| several GPUs, full fine-tune fits ZeRO-2    | ZeRO-2                                          |
| several GPUs, large full fine-tune          | ZeRO-3; + optimizer CPU offload if still short  |
| model above 13B parameters                  | zero_init: never materialise the whole model    |
|                                             | on every rank before sharding                   |

Memory model (mixed precision Adam, bytes per parameter; N = world size):
full: bf16 weights 2 + bf16 grads 2 + fp32 master/m/v 12 = 16, of which ZeRO-1 shards the
12, ZeRO-2 the 12 + 2, ZeRO-3 all 16. Adapters: the frozen base costs 2 (bf16) or 0.5
(4-bit), the adapter (about ADAPTER_FRACTION of the base) 16 per trainable parameter.
Only `BUDGET_FRACTION` of a GPU's memory is counted on; the rest is left to activations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .deepspeed_json import DeepSpeedConfig, Offload, Optimizer, OptimizerParams, Precision, ZeroOptimization

TrainingMode = Literal["lora", "qlora", "full"]

ZERO_INIT_ABOVE_PARAMS = 13e9
BUDGET_FRACTION = 0.8
ASSUMED_GPU_MEMORY_GB = 80.0     # when a node does not report its GPU memory
ADAPTER_FRACTION = 0.01          # trainable adapter parameters / base parameters (generous)


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of full-parameter training's model state (mixed precision, Adam)."""

    weights: float = 2.0
    grads: float = 2.0
    optimizer: float = 12.0   # fp32 master weights and Adam's two moments


FULL_BYTES = StateBytes()
FROZEN_BYTES = {"lora": 2.0, "qlora": 0.5}
GB = 1e9
_SIZE_IN_NAME = re.compile(r"(?<![\w.])(?:(\d+)x)?(\d+(?:\.\d+)?)([bBmM])(?![a-zA-Z])")


class DistributedConfigError(ValueError):
    """The job cannot run as asked; the message says why (a user error, before training)."""


@dataclass(frozen=True)
class Topology:
    nodes: int = 1
    gpus_per_node: int = 1
    gpu_node: bool = True              # False: a CPU "node" (tests, demo)
    gpu_memory_gb: float = 0.0         # per GPU; 0 = unknown

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def budget_bytes(self) -> float:
        return (self.gpu_memory_gb or ASSUMED_GPU_MEMORY_GB) * GB * BUDGET_FRACTION


@dataclass(frozen=True)
class _Shape:
    """What every plan for a job on a topology shares."""

    mode: TrainingMode
    world_size: int
    zero_init: bool

    def plan(self, zero_stage: int | None, reasons: tuple[str, ...], *, offload_optimizer: bool = False,
             offload_params: bool = False) -> DistributedPlan:
        return DistributedPlan(self.mode, self.world_size, zero_stage, self.zero_init, offload_optimizer,
                               offload_params, reasons)


@dataclass(frozen=True)
class DistributedPlan:
    mode: TrainingMode
    world_size: int
    zero_stage: int | None             # None: no DeepSpeed at all
    zero_init: bool = False
    offload_optimizer: bool = False
    offload_params: bool = False
    reasons: tuple[str, ...] = field(default=())

    @property
    def uses_deepspeed(self) -> bool:
        return self.zero_stage is not None


# the weights an `adapter` hyperparameter (or a method of the same name) trains
_MODE_OF: dict[object, TrainingMode] = {"lora": "lora", "qlora": "qlora", "full": "full", "none": "full", None: "full"}


def training_mode(method: str, hyperparameters: Mapping[str, object]) -> TrainingMode:
    """Which weights a method trains. DPO/ORPO/CPT train a LoRA adapter unless the job asks
    for `adapter: "none"` (all weights) or `adapter: "qlora"`."""
    if method in ("lora", "qlora", "full"):
        return _MODE_OF[method]
    if method == "reinforcement":   # GRPO on a LoRA adapter
        return "lora"
    if method not in ("dpo", "orpo", "cpt"):
        raise DistributedConfigError(f"unknown training method {str(method)!r}")
    adapter = hyperparameters.get("adapter", "lora")
    if isinstance(adapter, str | None) and adapter in _MODE_OF:
        return _MODE_OF[adapter]
    raise DistributedConfigError(f"adapter must be 'lora', 'qlora' or 'none', got {adapter!r}")


def requested_zero_stage(hyperparameters: Mapping[str, object]) -> int | None:
    stage = hyperparameters.get("zero_stage")
    if stage is None:
        return None
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (0, 1, 2, 3):
        raise DistributedConfigError(f"zero_stage must be 0, 1, 2 or 3, got {stage!r}")
    return stage


def bytes_per_gpu(mode: TrainingMode, params: float, stage: int | None, world_size: int) -> float:
    """Model state (weights, grads, optimizer) one GPU holds under a ZeRO stage (None = plain DDP)."""
    n = max(world_size, 1)
    s = stage or 0
    if mode == "full":
        w, g, o = FULL_BYTES.weights, FULL_BYTES.grads, FULL_BYTES.optimizer
        return params * ((w / n if s >= 3 else w) + (g / n if s >= 2 else g) + (o / n if s >= 1 else o))
    frozen = params * FROZEN_BYTES[mode]
    trainable = params * ADAPTER_FRACTION
    adapter = trainable * ((2 / n if s >= 3 else 2) + (2 / n if s >= 2 else 2) + (12 / n if s >= 1 else 12))
    return (frozen / n if s >= 3 else frozen) + adapter


def plan_distributed(mode: TrainingMode, params: float | None, topology: Topology,
                     requested_stage: int | None = None) -> DistributedPlan:
    """Apply the rules of the module docstring; DistributedConfigError when no rule allows the job."""
    if topology.nodes < 1 or topology.gpus_per_node < 1:
        raise DistributedConfigError("a segment needs at least one node and one device")
    if mode == "qlora" and requested_stage == 3:
        raise DistributedConfigError(
            "QLoRA cannot run with ZeRO-3: ZeRO-3 shards the frozen 4-bit weights, which bitsandbytes' "
            "kernels need whole (cryptic CUDA errors or wrong gradients); use ZeRO-1/2 or LoRA with ZeRO-3")
    zero_init = bool(params and params > ZERO_INIT_ABOVE_PARAMS and topology.gpu_node)
    base = _Shape(mode, topology.world_size, zero_init)
    if not topology.gpu_node:
        if topology.nodes > 1:   # each CPU node runs one process; the nodes' gradients meet over gloo
            return base.plan(zero_stage=None, reasons=(f"{topology.nodes} CPU nodes: DDP over gloo, one process "
                                                       "per node, no DeepSpeed",))
        return base.plan(zero_stage=None, reasons=("CPU node: one plain process",))
    size = params or 0.0
    if requested_stage is not None:
        return _requested(mode, size, topology, requested_stage, base)
    if topology.world_size == 1:
        return _single_gpu(mode, size, topology, base)
    if mode == "full":
        return _full_multi_gpu(size, topology, base)
    return _adapter_multi_gpu(mode, size, topology, base)


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _zero_init_reason(base: _Shape) -> tuple[str, ...]:
    return ("model above 13B parameters: zero_init, no rank materialises the whole model",) if base.zero_init else ()


def _requested(mode: TrainingMode, size: float, t: Topology, stage: int, base: _Shape) -> DistributedPlan:
    if t.world_size == 1 and stage in (1, 2):
        return base.plan(zero_stage=None,
                               reasons=(f"ZeRO-{stage} shards nothing on one GPU: plain process",))
    if stage == 0:
        if t.world_size > 1 and bytes_per_gpu(mode, size, 0, t.world_size) > t.budget_bytes:
            raise DistributedConfigError(
                f"zero_stage 0 needs {_gb(bytes_per_gpu(mode, size, 0, t.world_size))} per GPU, more than the "
                f"{_gb(t.budget_bytes)} budget: leave zero_stage unset or pick 2 or 3")
        return base.plan(zero_stage=0 if t.world_size > 1 else None,
                               reasons=("zero_stage 0 requested: data parallel, nothing sharded",))
    return base.plan(zero_stage=stage,
                           reasons=(f"zero_stage {stage} requested", *_zero_init_reason(base)))


def _single_gpu(mode: TrainingMode, size: float, t: Topology, base: _Shape) -> DistributedPlan:
    need = bytes_per_gpu(mode, size, None, 1)
    if need <= t.budget_bytes:
        return base.plan(zero_stage=None, reasons=("one GPU: plain process",))
    if mode != "full":
        raise DistributedConfigError(
            f"the frozen base model alone needs {_gb(need)}, more than one GPU's {_gb(t.budget_bytes)} budget: "
            "ask for more GPUs" + (" or use QLoRA" if mode == "lora" else ""))
    return base.plan(zero_stage=3, offload_optimizer=True, offload_params=True,
                           reasons=(f"full fine-tune needs {_gb(need)} > {_gb(t.budget_bytes)} on one GPU: "
                                    "ZeRO-3 with optimizer and parameter CPU offload", *_zero_init_reason(base)))


def _full_multi_gpu(size: float, t: Topology, base: _Shape) -> DistributedPlan:
    n = t.world_size
    zero2 = bytes_per_gpu("full", size, 2, n)
    if zero2 <= t.budget_bytes:
        return base.plan(zero_stage=2, reasons=(
            f"full fine-tune fits ZeRO-2 ({_gb(zero2)} per GPU)", *_zero_init_reason(base)))
    zero3 = bytes_per_gpu("full", size, 3, n)
    why = f"large full fine-tune: ZeRO-2 needs {_gb(zero2)} per GPU > {_gb(t.budget_bytes)}"
    if zero3 <= t.budget_bytes:
        return base.plan(zero_stage=3, reasons=(f"{why}: ZeRO-3 ({_gb(zero3)})",
                                                              *_zero_init_reason(base)))
    return base.plan(zero_stage=3, offload_optimizer=True, reasons=(
        f"{why}, ZeRO-3 needs {_gb(zero3)}: ZeRO-3 with optimizer CPU offload", *_zero_init_reason(base)))


def _adapter_multi_gpu(mode: TrainingMode, size: float, t: Topology, base: _Shape) -> DistributedPlan:
    n = t.world_size
    zero2 = bytes_per_gpu(mode, size, 2, n)
    if zero2 <= t.budget_bytes:
        return base.plan(zero_stage=2, reasons=(
            f"{mode} adapter: ZeRO-2 shards its gradients and optimizer states, frozen base replicated "
            f"({_gb(zero2)} per GPU)", *_zero_init_reason(base)))
    if mode == "qlora":
        raise DistributedConfigError(
            f"the 4-bit base model needs {_gb(zero2)} per GPU, more than the {_gb(t.budget_bytes)} budget, and "
            "QLoRA cannot shard it with ZeRO-3: use GPUs with more memory, or LoRA (which may use ZeRO-3)")
    return base.plan(zero_stage=3, reasons=(
        f"frozen base needs {_gb(zero2)} per GPU > {_gb(t.budget_bytes)}: ZeRO-3 shards it",
        *_zero_init_reason(base)))


def deepspeed_config(plan: DistributedPlan) -> DeepSpeedConfig | None:
    """The DeepSpeed config for a plan (None without DeepSpeed). "auto" values are filled in by the
    HF Trainer from its TrainingArguments, so batch sizes and precision stay in one place."""
    if not plan.uses_deepspeed:
        return None
    zero = ZeroOptimization(stage=plan.zero_stage, overlap_comm=True, contiguous_gradients=True,
                            reduce_bucket_size="auto")
    if plan.zero_stage == 3:
        zero = zero.model_copy(update={"stage3_prefetch_bucket_size": "auto",
                                       "stage3_param_persistence_threshold": "auto",
                                       "stage3_gather_16bit_weights_on_model_save": True})
    if plan.offload_optimizer:
        zero = zero.model_copy(update={"offload_optimizer": Offload(device="cpu", pin_memory=True)})
    if plan.offload_params:
        zero = zero.model_copy(update={"offload_param": Offload(device="cpu", pin_memory=True)})
    config = DeepSpeedConfig(
        train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto", train_batch_size="auto",
        gradient_clipping="auto", bf16=Precision(enabled="auto"), fp16=Precision(enabled="auto"),
        zero_optimization=zero,
        steps_per_print=1_000_000,          # the recipe reports progress itself
        wall_clock_breakdown=False)
    if plan.offload_optimizer:
        # offloaded optimizer states need DeepSpeed's CPU Adam, declared here
        config = config.model_copy(update={"optimizer": Optimizer(type="AdamW", params=OptimizerParams(
            lr="auto", betas="auto", eps="auto", weight_decay="auto"))})
    return config


def param_count_hint(model_ref: str) -> float | None:
    """Parameters read off a Hub-style name ("Llama-3.1-70B-Instruct" -> 70e9; a mixture
    "8x7B" counts as 56e9, an upper bound), for models the node cannot inspect locally.
    None when the name says nothing."""
    sizes = []
    for m in _SIZE_IN_NAME.finditer(model_ref.replace("/", " ")):
        experts = int(m.group(1)) if m.group(1) else 1
        sizes.append(experts * float(m.group(2)) * (1e9 if m.group(3).lower() == "b" else 1e6))
    return max(sizes) if sizes else None
