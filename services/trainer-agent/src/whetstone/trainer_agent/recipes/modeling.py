"""Base model loading per method: full precision, 4-bit NF4 (QLoRA), LoRA wrapping."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import PlatformError, UserError
from .hyperparams import Hyperparameters

if TYPE_CHECKING:
    from ..domain.deepspeed_json import DeepSpeedConfig

log = logging.getLogger("whetstone.trainer_agent.recipes")

CPU_MICRO_BATCH_TOKENS = 4096
GPU_MICRO_BATCH_TOKENS = 16384


@contextmanager
def _base_model_errors() -> Iterator[None]:
    """A base model missing on this node is the platform's fault, not the user's."""
    from whetstone.modelkit.loading import ModelNotFoundError

    try:
        yield
    except ModelNotFoundError as exc:
        raise PlatformError(f"base model: {exc}", code="base_model_missing") from exc


def compute_dtype():
    import torch

    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_base_tokenizer(ref: str):
    from whetstone.modelkit.loading import load_tokenizer

    with _base_model_errors():
        return load_tokenizer(ref)


def load_base_config(ref: str):
    from transformers import AutoConfig
    from whetstone.modelkit.loading import check_local_model_dir, is_local_ref

    with _base_model_errors():
        source = str(check_local_model_dir(ref)) if is_local_ref(ref) else ref
        return AutoConfig.from_pretrained(source)


def check_sequence_length(config, max_seq_len: int) -> None:
    limit = getattr(config, "max_position_embeddings", None)
    if limit and max_seq_len > limit:
        raise UserError(f"max_seq_len={max_seq_len} exceeds the base model's context of {limit} tokens",
                        code="invalid_hyperparameters")


FULL_PARAMETER_METHODS = frozenset({"full", "cpt"})


def torch_float32():
    import torch

    return torch.float32


# a vision-language base keeps these in the compute dtype under QLoRA (and its output head, as bitsandbytes does);
# transformers matches each pattern from the start of a module's full name
VISION_UNQUANTIZED = (r".*\.(vision_tower|vision_model|visual|multi_modal_projector|mm_projector|connector)",
                      "lm_head")


def quantization_config(skip_modules: tuple[str, ...] | None = None):
    """QLoRA: 4-bit NF4 weights, double quantization of the block scales, compute in bf16/fp32;
    `skip_modules`: module names left unquantized."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype(),
                              **({"llm_int8_skip_modules": list(skip_modules)} if skip_modules else {}))


def deepspeed_zero_init(deepspeed: DeepSpeedConfig | None, zero_init: bool):
    """With ZeRO-3 and zero_init, from_pretrained must see the DeepSpeed config BEFORE loading, so that
    each rank materialises only its shard: keep the returned object alive while models are loaded."""
    if deepspeed is None or not (zero_init and deepspeed.zero_stage == 3):
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(deepspeed.document())


def load_base_model(ref: str, method: str, *, packing: bool, vision: bool = False):
    """The base model for `method`; packed batches need the per-example attention kernel. `vision`:
    a vision-language model (AutoModelForImageTextToText: vision tower, projector, language model)."""
    from . import attention

    impl = attention.register() if packing else "sdpa"
    with _base_model_errors():
        return _load_base_model(ref, method, impl, vision)


def _load_base_model(ref: str, method: str, attn_implementation: str, vision: bool = False):
    from whetstone.modelkit.loading import load_model
    from whetstone.modelkit.vision import load_vision_model

    load = load_vision_model if vision else load_model  # same keywords
    quantization, device_map = None, None   # from_pretrained's defaults: full precision, no placement
    if method == "qlora":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as exc:
            raise PlatformError("method qlora needs bitsandbytes on this node", code="missing_dependency") from exc
        quantization = quantization_config(VISION_UNQUANTIZED if vision else None)
        device_map = {"": _device()}
    # full-parameter training keeps fp32 master weights (bf16 autocast on GPU); a frozen LoRA base can be bf16
    dtype = torch_float32() if method in FULL_PARAMETER_METHODS else compute_dtype()
    model = load(ref, dtype=dtype, attn_implementation=attn_implementation, quantization_config=quantization,
                 device_map=device_map)
    # no KV cache while training: it wastes memory, and with one stock sdpa ignores packed position_ids
    model.config.use_cache = False
    if method == "qlora":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return model


@dataclass(frozen=True)
class QuantizationSummary:
    """The 4-bit layers of a loaded base, as read back from bitsandbytes."""

    bits: int
    quant_type: list[str]
    layers: int
    double_quant: bool
    compute_dtype: str


def quantization_summary(model) -> QuantizationSummary | None:
    """What the loaded base weights really are (read back from the bitsandbytes layers), or None."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        return None
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    if not layers:
        return None
    states = [layer.weight.quant_state for layer in layers]
    return QuantizationSummary(bits=4, quant_type=sorted({s.quant_type for s in states}), layers=len(layers),
                               double_quant=all(s.nested for s in states), compute_dtype=str(layers[0].compute_dtype))


@dataclass(frozen=True)
class BaseModelFacts:
    parameters: int                         # 4-bit packed weights counted at their logical size
    quantization: QuantizationSummary | None   # what the loaded base weights really are


def describe_base(model) -> BaseModelFacts:
    return BaseModelFacts(count_parameters(model), quantization_summary(model))


def micro_batch_token_budget(hp: Hyperparameters) -> int:
    """Token budget of a batch_size "auto" micro-batch: the user's, else by device."""
    import torch

    return hp.micro_batch_tokens or (GPU_MICRO_BATCH_TOKENS if torch.cuda.is_available() else CPU_MICRO_BATCH_TOKENS)


def empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def count_parameters(model) -> int:
    """Parameters of the base model (4-bit packed weights counted at their logical size)."""
    total = 0
    for param in model.parameters():
        shape = getattr(getattr(param, "quant_state", None), "shape", None)
        total += int(shape.numel()) if shape is not None else param.numel()
    return total


def linear_module_names(model) -> list[str]:
    """Sorted leaf names of every linear layer except the output head ('all-linear', but stable)."""
    import torch

    head = model.get_output_embeddings()
    linear_types: tuple[type, ...] = (torch.nn.Linear,)
    try:
        import bitsandbytes as bnb

        linear_types += (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    except ImportError:
        pass
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, linear_types) and module is not head
    }
    return sorted(names)


def lora_targets(model, hp: Hyperparameters) -> list[str]:
    """The modules to adapt; a requested module the model lacks is a user error."""
    available = linear_module_names(model)
    if hp.lora_target_modules is None:
        return available
    missing = sorted(set(hp.lora_target_modules) - set(available))
    if missing:
        raise UserError(f"lora_target_modules: the base model has no linear module named {', '.join(missing)} "
                        f"(available: {', '.join(available)})", code="invalid_hyperparameters")
    return list(hp.lora_target_modules)


def check_rank(model, targets: list[str], rank: int) -> None:
    import torch

    smallest = min(
        min(module.in_features, module.out_features)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in targets and hasattr(module, "in_features") and isinstance(module, torch.nn.Module)
    )
    if rank > smallest:
        raise UserError(f"lora_r={rank} exceeds the smallest dimension ({smallest}) of the adapted layers",
                        code="invalid_hyperparameters")


def lora_config(model, hp: Hyperparameters):
    from peft import LoraConfig

    targets = lora_targets(model, hp)
    check_rank(model, targets, hp.lora_r)
    return LoraConfig(r=hp.lora_r, lora_alpha=hp.lora_alpha, lora_dropout=hp.lora_dropout, target_modules=targets,
                      bias="none", task_type="CAUSAL_LM")
