"""`"auto"` hyperparameters, resolved at admission from the data and the model. Pure.

A knob is "auto" when the request leaves it out or says "auto"; a value the user gave always wins.
Resolved once the training file's verdict is known (examples and tokens counted by ingest), from the
base's size and the memory of the GPU shapes the job may run on:

- n_epochs: OpenAI's published rule (its fine-tuning data-preparation cookbook): 3 epochs, raised so a
  small file is seen about 100 times in all (at most 25 epochs), lowered so a large one is seen at most
  25,000 times (at least 1). Unlike OpenAI, a file of fewer than 10 examples is refused for "auto"
  (OpenAI refuses such files outright; an explicit n_epochs still trains on them).
- batch size (examples per optimizer step, OpenAI's meaning): OpenAI's ~0.2% of the examples capped at
  256, rounded to a power of two, with a floor of 8 (OpenAI's rule gives 1 below 750 examples; a LoRA
  step on one example is noisy and slow on a GPU). It is split into a micro-batch that fits the GPU:
  the largest power of two whose activations (two tokens per example on average, as headroom for long
  rows, never more than max_seq_len) fit the memory the smallest GPU of the job's shapes has left
  after weights and optimizer, and gradient accumulation makes up the rest.
- gradient_checkpointing: off when a micro-batch of min(8, the batch) fits without it (or checkpointing
  would not fit a larger one), on otherwise (the larger micro-batch it allows uses the GPU better).
- lora_r by base size (< 10B: 16, < 40B: 32, else 64), lora_alpha = 2 x lora_r. Never under 16: with the
  trainer's table (< 1B: 8) `make bench-training` measured rank 8 worse than today's 16 on the demo data
  and a file 10x larger (holdout loss 8.078 vs 7.882 and 5.009 vs 4.493, seed spread 0.011 and 0.005).
- learning_rate per method (jobs.METHOD_DEFAULTS: LoRA/QLoRA 2e-4, full/CPT 2e-5, DPO 5e-6, ORPO 8e-6). For
  LoRA/QLoRA on a base narrower than 2048 (hidden size) the rate grows as 2048 / hidden, at most 10x: Adam's
  best rate for hidden weights scales as 1 / width (muP, Tensor Programs V), and 2e-4 is the rate published
  for bases of 2048 and wider. A 64-wide tiny-llama gets 2e-3: at 2e-4 the demo file's 81 steps moved its
  holdout loss 4.6 % (the gate asks 5 %), at 2e-3 (56 steps) 24 %. A 0.5B base (896 wide) gets 4.6e-4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from whetstone.contracts import Hyperparameters

from .jobs import Rejection
from .placement import Shape
from .resources import (
    CPU, GB, GPU_CATALOG, METHOD_KIND, PER_GPU_OVERHEAD_GB, USABLE_MEMORY, ModelArch, dims_of, training_memory,
)

TARGET_EPOCHS, MIN_TARGET_EXAMPLES, MAX_TARGET_EXAMPLES = 3, 100, 25_000
MIN_AUTO_EPOCHS, MAX_AUTO_EPOCHS = 1, 25
MIN_EXAMPLES_FOR_AUTO = 10
BATCH_FRACTION, MIN_AUTO_BATCH, MAX_AUTO_BATCH = 0.002, 8, 256
MAX_MICRO_BATCH = 64
RANK_BY_SIZE = ((10e9, 16), (40e9, 32))   # (params below, rank); larger bases: 64
LR_REFERENCE_WIDTH, MAX_LR_SCALE = 2048, 10.0   # LoRA's default rate is for bases this wide; narrower: up to 10x
LR_SCALED_METHODS = frozenset({"lora", "qlora"})
METHODS = frozenset({"lora", "qlora", "full", "cpt", "dpo", "orpo"})   # the platform's trainers


def too_few_examples(given: Hyperparameters, examples: int) -> Rejection | None:
    """"auto" epochs cannot be chosen for a file this small (an explicit n_epochs still trains on it)."""
    if given.n_epochs is None and examples < MIN_EXAMPLES_FOR_AUTO:
        return Rejection("too_few_examples", f"n_epochs 'auto' needs at least {MIN_EXAMPLES_FOR_AUTO} training "
                         f"examples; the training file has {examples}. Add examples or give n_epochs",
                         param="hyperparameters.n_epochs")
    return None


def auto_epochs(examples: int) -> int:
    if examples * TARGET_EPOCHS < MIN_TARGET_EXAMPLES:
        return min(MAX_AUTO_EPOCHS, max(TARGET_EPOCHS, MIN_TARGET_EXAMPLES // examples))
    if examples * TARGET_EPOCHS > MAX_TARGET_EXAMPLES:
        return max(MIN_AUTO_EPOCHS, MAX_TARGET_EXAMPLES // examples)
    return TARGET_EPOCHS


def auto_batch(examples: int) -> int:
    wanted = max(1.0, BATCH_FRACTION * examples)
    return int(min(MAX_AUTO_BATCH, max(MIN_AUTO_BATCH, 2 ** round(math.log2(wanted)))))


def rank_for_size(params: int) -> int:
    return next((rank for limit, rank in RANK_BY_SIZE if params < limit), 64)


def auto_learning_rate(method: str, default: float, hidden_size: int | None) -> float:
    """The method's default rate, scaled up as 2048 / hidden (at most 10x) for a narrow base under LoRA/QLoRA."""
    if method not in LR_SCALED_METHODS or not hidden_size:
        return default
    scale = min(MAX_LR_SCALE, max(1.0, LR_REFERENCE_WIDTH / hidden_size))
    return float(f"{default * scale:.3g}")


def activation_bytes_per_token(arch: ModelArch, method: str, checkpointing: bool) -> float:
    """resources.training_memory's activation model: with gradient checkpointing every layer keeps its
    bf16 input and one layer is live; without it every layer keeps all of its (~34 B per hidden unit)."""
    hidden, layers, vocab = dims_of(arch)
    per_layer = (2 * layers + 34) if checkpointing else 34 * layers
    factor = 2 if method in ("dpo", "orpo") else 1   # chosen and rejected in the same step
    return factor * (hidden * per_layer + vocab * 6)


@dataclass(frozen=True)
class Geometry:
    micro_batch: int
    accumulation: int
    gradient_checkpointing: bool


def plan_geometry(arch: ModelArch, method: str, hp: Hyperparameters, effective: int, tokens_per_example: int,
                  gpu_memory_gb: float, gpus: int) -> Geometry:
    """Micro-batch x accumulation = `effective` examples per step, the micro-batch fitting the GPU."""
    static = training_memory(arch, method, hp)
    free = (gpu_memory_gb * USABLE_MEMORY - static.sharded / max(gpus, 1) - PER_GPU_OVERHEAD_GB) * GB

    def micro_for(checkpointing: bool) -> int:   # 0: not even one example fits
        per_example = tokens_per_example * activation_bytes_per_token(arch, method, checkpointing)
        fits = int(free // per_example) if per_example > 0 and free > 0 else 0
        micro = 1 if fits else 0
        while micro and micro * 2 <= min(effective, MAX_MICRO_BATCH, fits):
            micro *= 2
        return micro

    plain, checkpointed = micro_for(False), micro_for(True)
    if plain >= min(effective, MIN_AUTO_BATCH) or plain >= checkpointed:
        micro, checkpointing = max(plain, 1), False
    else:   # checkpointing buys a micro-batch the GPU can use well
        micro, checkpointing = max(checkpointed, 1), True
    return Geometry(micro, math.ceil(effective / micro), checkpointing)


@dataclass(frozen=True)
class DataFacts:
    examples: int
    tokens_total: int | None


def resolve_auto(method: str, given: Hyperparameters, resolved: Hyperparameters, arch: ModelArch,
                 data: DataFacts, gpu_memory_gb: float, gpus: int) -> tuple[Hyperparameters, list[str]] | Rejection:
    """`resolved` (jobs.resolve_hyperparameters' defaults) with every knob the user left "auto" chosen from
    the data and the model; returns (hyperparameters, the knobs chosen here) or why "auto" cannot choose.
    A knob is "auto" when the request left it unset (the request's "auto" reads as unset; batch_size keeps it)."""
    hp = resolved
    chosen: list[str] = []
    examples = max(0, data.examples)
    if given.n_epochs is None:
        if refused := too_few_examples(given, examples):
            return refused
        hp = hp.model_copy(update={"n_epochs": auto_epochs(examples)})
        chosen.append("n_epochs")
    if METHOD_KIND.get(method) != "full" and hp.lora_r is not None:
        if given.lora_r is None:
            hp = hp.model_copy(update={"lora_r": rank_for_size(arch.params)})
            chosen.append("lora_r")
        if given.lora_alpha is None:
            hp = hp.model_copy(update={"lora_alpha": 2 * (hp.lora_r or 0)})
            chosen.append("lora_alpha")
    if given.learning_rate is None:
        hp = hp.model_copy(update={"learning_rate": auto_learning_rate(method, float(hp.learning_rate or 0.0),
                                                                       arch.hidden_size)})
        chosen.append("learning_rate")
    if given.batch_size in (None, "auto") and given.gradient_accumulation_steps is None:
        effective = auto_batch(examples)
        seq = int(hp.max_seq_len or 2048)
        mean = math.ceil(data.tokens_total / examples) if data.tokens_total and examples else None
        per_example = min(seq, 2 * mean) if mean else seq   # unknown lengths: the longest row allowed
        g = plan_geometry(arch, method, hp, effective, per_example, gpu_memory_gb, gpus)
        hp = hp.model_copy(update={"batch_size": g.micro_batch, "gradient_accumulation_steps": g.accumulation,
                                   "gradient_checkpointing": g.gradient_checkpointing})
        chosen += ["batch_size", "gradient_accumulation_steps", "gradient_checkpointing"]
    return hp, chosen


def tightness(hp: Hyperparameters) -> tuple[int, bool]:
    """Orders resolutions from the most constrained: the smaller micro-batch, then checkpointing on."""
    micro = hp.batch_size
    return (micro if isinstance(micro, int) else 0, not hp.gradient_checkpointing)


def resolve_for_job(method: str, given: Hyperparameters, resolved: Hyperparameters,
                    arch: ModelArch, shapes: Sequence[Shape], cpu_memory_gb: float,
                    data: DataFacts) -> tuple[Hyperparameters, list[str]] | Rejection:
    """resolve_auto for the job's shapes: the batch geometry of the shape with the least memory to spare
    (placement may pick any of them; the trainer still halves the micro-batch if it runs out of memory)."""
    best: tuple[Hyperparameters, list[str]] | None = None
    for shape in shapes or (Shape(CPU, 1),):
        gpu = GPU_CATALOG.get(shape.gpu_type)
        memory = gpu.memory_gb if gpu else cpu_memory_gb
        got = resolve_auto(method, given, resolved, arch, data, memory, shape.total)
        if isinstance(got, Rejection):
            return got
        if best is None or tightness(got[0]) < tightness(best[0]):
            best = got
    assert best is not None
    return best
