"""Resource requests: model size -> training memory -> GPU shapes and runtime estimates. Pure.

The scheduler never loads a model. It reads the parameter count from the catalog
entry's ``config.json`` (hidden_size, num_hidden_layers, intermediate_size, vocab_size,
...), else from a size hint in the name ("llama-3-70b", "Qwen2.5-0.5B"), else from the
size of the weight files.

Memory per GPU for a job sharded over ``n`` GPUs (ZeRO-3 / FSDP shard every state):

    full, cpt      16 B/param (bf16 weights 2 + grads 2 + fp32 master 4 + Adam m,v 8)
    lora, dpo, orpo  2 B/param frozen bf16 base + 16 B per adapter param
    qlora          0.5 B/param 4-bit base (+ quantisation constants) + 16 B per adapter param
    + activations of one micro-batch per GPU (gradient checkpointing assumed) + logits
    + a fixed per-GPU overhead (CUDA context, allocator fragmentation)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from whetstone.contracts import Hyperparameters

from .hf_config import HfConfig
from .placement import Shape

GB = 1024 ** 3


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gb: float
    tflops: float            # dense bf16 peak (fp16 for older parts)
    price_per_hour: float    # on-demand list price, only used to order alternatives


# What the scheduler knows about GPU types announced by heartbeats or k8s labels.
GPU_CATALOG: dict[str, GpuModel] = {g.name: g for g in [
    GpuModel("H200", 141, 989, 4.50),
    GpuModel("H100", 80, 989, 3.90),
    GpuModel("A100", 80, 312, 2.30),
    GpuModel("A100-40GB", 40, 312, 1.80),
    GpuModel("L40S", 48, 362, 1.60),
    GpuModel("A10G", 24, 70, 1.00),
    GpuModel("L4", 24, 121, 0.80),
    GpuModel("V100", 32, 125, 1.50),
    GpuModel("T4", 16, 65, 0.50),
]}
CPU = "cpu"
CPU_TFLOPS = 0.2
MFU = 0.35                      # model FLOPs utilisation assumed for runtime estimates
USABLE_MEMORY = 0.90            # of a GPU's memory a job may plan to use
PER_GPU_OVERHEAD_GB = 1.5
DEFAULT_NODE_SIZE = 8
MAX_NODES_PER_JOB = 16

METHOD_KIND = {"full": "full", "cpt": "full", "lora": "lora", "dpo": "lora", "orpo": "lora", "qlora": "qlora",
               "reinforcement": "lora"}


@lru_cache(maxsize=1024)
def canonical_gpu_type(label: str) -> str:
    """'NVIDIA-A100-SXM4-80GB', 'a100', 'Tesla-T4' -> catalog names; unknown labels pass through."""
    text = label.upper().replace("_", "-")
    if text in ("CPU", ""):
        return CPU
    for name in ("H200", "H100", "L40S", "A10G", "V100", "T4", "L4"):
        if re.search(rf"(^|[^A-Z0-9]){name}([^A-Z0-9]|$)", text):
            return name
    if re.search(r"(^|[^A-Z0-9])A100([^A-Z0-9]|$)", text):
        return "A100-40GB" if re.search(r"40G", text) else "A100"
    return label


# ---------------------------------------------------------------- model size


@dataclass(frozen=True)
class ModelArch:
    params: int
    source: str                       # config | name | weights | default
    hidden_size: int | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    max_positions: int | None = None
    target_module_dims: tuple[tuple[int, int], ...] = ()   # (in, out) of each LoRA-targeted matrix per layer


def arch_from_config(config: HfConfig) -> ModelArch | None:
    """Parameter count of a decoder-only transformer from its config.json; None if the sizes are absent."""
    c = config.text
    h, layers, vocab = c.hidden, c.layers, c.vocab_size
    if not (h and layers and vocab):
        return None
    heads = c.heads or max(1, h // 128)
    head_dim = c.head_dim or h // heads
    kv_heads = c.num_key_value_heads or heads
    inter = c.intermediate or 4 * h
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = h * q + 2 * h * kv + q * h
    mlp = (3 if c.gated else 2) * h * inter * c.experts
    embeddings = vocab * h * (1 if c.tie_word_embeddings else 2)
    params = layers * (attention + mlp + 2 * h) + embeddings
    mlp_dims = ((h, inter), (h, inter), (inter, h)) if c.gated else ((h, inter), (inter, h))
    targets = ((h, q), (h, kv), (h, kv), (q, h)) + mlp_dims
    return ModelArch(int(params), "config", h, layers, vocab, c.max_positions, targets)


_SIZE_HINT = re.compile(r"(?<![a-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)([bm])(?![a-z])", re.IGNORECASE)


def params_from_name(name: str) -> int | None:
    """'Llama-3-70B-Instruct' -> 70e9, 'mixtral-8x7b' -> 56e9, 'smollm-135m' -> 135e6."""
    best = None
    for experts, number, unit in _SIZE_HINT.findall(name.rsplit("/", 1)[-1]):
        value = float(number) * (1e9 if unit.lower() == "b" else 1e6) * (int(experts) if experts else 1)
        best = max(best or 0, int(value))
    return best


def model_arch(name: str, config: HfConfig | None, weight_bytes: int | None,
               bytes_per_param: float = 2.0) -> ModelArch:
    """Best available size: config.json, then the name's size hint, then the weight files' size."""
    if config:
        arch = arch_from_config(config)
        if arch:
            return arch
    hinted = params_from_name(name)
    if hinted:
        return ModelArch(hinted, "name")
    if weight_bytes:
        return ModelArch(max(1, int(weight_bytes / bytes_per_param)), "weights")
    return ModelArch(0, "unknown")


def dims_of(arch: ModelArch) -> tuple[int, int, int]:
    """(hidden size, layers, vocabulary): the config's when it gave them all, else approximated from the size."""
    if arch.hidden_size and arch.num_layers and arch.vocab_size:
        return arch.hidden_size, arch.num_layers, arch.vocab_size
    return _approx_dims(arch.params)


def _approx_dims(params: int) -> tuple[int, int, int]:
    """(hidden, layers, vocab) of a Llama-shaped model of this size (params ~ 12 L h^2, h ~ 128 L),
    for the activation math when only the parameter count is known."""
    layers = max(1, round((max(params, 1) / 196608) ** (1 / 3)))
    return 128 * layers, layers, 32000


# ------------------------------------------------------------------ memory


@dataclass(frozen=True)
class MemoryEstimate:
    """GB. ``sharded`` divides by the GPU count; ``per_gpu`` does not."""

    weights: float
    gradients: float
    optimizer: float
    adapter: float
    activations: float
    overhead: float

    @property
    def sharded(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.adapter

    @property
    def per_gpu(self) -> float:
        return self.activations + self.overhead

    @property
    def total(self) -> float:
        return self.sharded + self.per_gpu

    def on(self, gpus: int) -> float:
        return self.sharded / gpus + self.per_gpu


def adapter_params(arch: ModelArch, lora_r: int) -> int:
    hidden, layers, _ = (arch.hidden_size, arch.num_layers, arch.vocab_size) if arch.hidden_size else \
        _approx_dims(arch.params)
    dims = arch.target_module_dims or ((hidden, hidden),) * 4 + ((hidden, 4 * hidden),) * 2 + ((4 * hidden, hidden),)
    return int(lora_r * sum(i + o for i, o in dims) * (layers or 1))


def training_memory(arch: ModelArch, method: str, hp: Hyperparameters) -> MemoryEstimate:
    kind = METHOD_KIND.get(method, "full")
    p = arch.params
    given = hp.batch_size
    micro_batch = given if isinstance(given, int) and given > 0 else 8   # "auto": sized for the default
    seq = int(hp.max_seq_len or 2048)
    hidden, layers, vocab = dims_of(arch)
    # gradient checkpointing: every layer keeps its bf16 input, one layer is live (~34 B/token/hidden),
    # plus the logits in bf16 and fp32 for the loss
    tokens = micro_batch * seq
    activations = (tokens * hidden * (2 * layers + 34) + tokens * vocab * 6) / GB
    if method in ("dpo", "orpo"):
        activations *= 2          # chosen + rejected sequences in the same step
    if kind == "full":
        return MemoryEstimate(2 * p / GB, 2 * p / GB, 12 * p / GB, 0.0, activations, PER_GPU_OVERHEAD_GB)
    base_bytes = 0.5 * 1.06 if kind == "qlora" else 2.0   # 4-bit + quantisation constants
    lora = adapter_params(arch, int(hp.lora_r or 16))
    return MemoryEstimate(base_bytes * p / GB, 0.0, 0.0, 18 * lora / GB, activations, PER_GPU_OVERHEAD_GB)


# ------------------------------------------------------------- GPU shapes


@dataclass(frozen=True)
class GpuOffer:
    """One GPU type the pool has (or the catalog knows): memory per GPU, GPUs per node."""

    gpu_type: str
    memory_gb: float
    node_size: int
    tflops: float
    price_per_hour: float


def offers(pool: Iterable[tuple[str, float, int]], cpu_memory_gb: float, include_catalog: bool) -> list[GpuOffer]:
    """Offers from the pool's (gpu_type, gpu_memory_gb, gpu_count) triples, plus the catalog when
    the pool is not known yet. A node reporting memory 0 gets its catalog (or CPU) figure."""
    found: dict[str, GpuOffer] = {}
    for raw_type, memory, count in pool:
        gpu_type = canonical_gpu_type(raw_type)
        known = GPU_CATALOG.get(gpu_type)
        mem = memory or (known.memory_gb if known else cpu_memory_gb if gpu_type == CPU else 0)
        if mem <= 0 or count <= 0:
            continue
        prev = found.get(gpu_type)
        found[gpu_type] = GpuOffer(gpu_type, min(mem, prev.memory_gb) if prev else mem,
                                   max(count, prev.node_size if prev else 0),
                                   known.tflops if known else (CPU_TFLOPS if gpu_type == CPU else 100.0),
                                   known.price_per_hour if known else (0.0 if gpu_type == CPU else 2.0))
    if include_catalog:
        for g in GPU_CATALOG.values():
            found.setdefault(g.name, GpuOffer(g.name, g.memory_gb, DEFAULT_NODE_SIZE, g.tflops, g.price_per_hour))
        found.setdefault(CPU, GpuOffer(CPU, cpu_memory_gb, 1, CPU_TFLOPS, 0.0))
    return list(found.values())


def gpus_needed(memory: MemoryEstimate, gpu_memory_gb: float) -> int | None:
    """Smallest GPU count (1, 2, 4, 8, then multiples of 8) whose per-GPU share fits; None if none does."""
    usable = gpu_memory_gb * USABLE_MEMORY
    if memory.per_gpu >= usable:
        return None
    exact = math.ceil(memory.sharded / (usable - memory.per_gpu))
    n = 1
    while n < exact:
        n *= 2
    return n


def shape_for(gpu_type: str, gpus: int, node_size: int) -> Shape | None:
    """One node when it has enough GPUs, else whole nodes of one interconnect group."""
    if gpus <= node_size:
        return Shape(gpu_type, gpus, 1)
    nodes = math.ceil(gpus / node_size)
    return Shape(gpu_type, node_size, nodes) if nodes <= MAX_NODES_PER_JOB else None


@dataclass(frozen=True)
class ResourcePlan:
    shapes: tuple[Shape, ...]                 # acceptable, most preferred first
    memory: MemoryEstimate
    arch: ModelArch
    refused: dict[str, str] = field(default_factory=dict)   # gpu_type -> why it cannot host the job


def plan_shapes(arch: ModelArch, method: str, hp: Hyperparameters, available: Iterable[GpuOffer],
                cpu_max_params: int) -> ResourcePlan:
    """Every GPU type that can hold the job, with its GPU count and node count, cheapest first."""
    memory = training_memory(arch, method, hp)
    ranked: list[tuple[tuple[int, float, int, str], Shape]] = []
    refused: dict[str, str] = {}
    for offer in available:
        if offer.gpu_type == CPU and arch.params > cpu_max_params:
            refused[CPU] = f"{arch.params / 1e6:.0f}M parameters is too large to train on CPU " \
                           f"(limit {cpu_max_params / 1e6:.0f}M)"
            continue
        n = gpus_needed(memory, offer.memory_gb)
        shape = shape_for(offer.gpu_type, n, offer.node_size) if n else None
        if shape is None:
            refused[offer.gpu_type] = (f"needs {memory.total:.1f} GB ({memory.per_gpu:.1f} GB per GPU unshardable); "
                                       f"{offer.memory_gb:g} GB GPUs would need more than "
                                       f"{MAX_NODES_PER_JOB} nodes of {offer.node_size}")
            continue
        cost = shape.total * offer.price_per_hour / max(offer.tflops, 1e-9)
        ranked.append(((shape.nodes, cost, shape.total, offer.gpu_type), shape))
    ranked.sort(key=lambda x: x[0])
    return ResourcePlan(tuple(s for _, s in ranked), memory, arch, refused)


def explicit_shape_problem(shape: Shape, memory: MemoryEstimate, available: Iterable[GpuOffer]) -> str | None:
    """Why a tenant's explicit request cannot hold the job, or None if it can."""
    offer = next((o for o in available if o.gpu_type == canonical_gpu_type(shape.gpu_type)), None)
    if offer is None:
        return f"gpu_type {shape.gpu_type!r} is not offered by this platform"
    if shape.gpus_per_node > offer.node_size:
        return f"{offer.gpu_type} nodes have {offer.node_size} GPUs, not {shape.gpus_per_node}"
    need = memory.on(shape.total)
    if need > offer.memory_gb * USABLE_MEMORY:
        return (f"the job needs {need:.1f} GB per GPU on {shape.total} GPU(s) "
                f"(total {memory.total:.1f} GB) but {offer.gpu_type} offers {offer.memory_gb:g} GB")
    return None


# --------------------------------------------------------------- runtime


def flops_per_token(arch: ModelArch, method: str) -> float:
    kind = METHOD_KIND.get(method, "full")
    factor = 6.0 if kind == "full" else 4.0          # LoRA: no weight gradients for the base
    if kind == "qlora":
        factor *= 1.4                                # dequantisation on every matmul
    if method in ("dpo", "orpo"):
        factor *= 1.5                                # reference log-probs
    return factor * max(arch.params, 1)


def estimate_runtime_s(arch: ModelArch, method: str, tokens: int | None, epochs: int, shape: Shape,
                       tflops: float, default_s: float = 3600.0) -> float:
    """Seconds of training on ``shape`` at MFU; ``default_s`` when the token count is unknown."""
    if not tokens:
        return default_s
    throughput = shape.total * tflops * 1e12 * MFU / flops_per_token(arch, method)
    return max(30.0, tokens * max(epochs, 1) / throughput)
