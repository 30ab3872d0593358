"""No checkpoint we resume from may run code: every pickle in it must load without executing
anything but tensor rebuilding (a checkpoint comes from object storage, where a planted one
could wait for the next resume).

- HF Trainer files (optimizer.pt, scheduler.pt, rng_state.pth, scaler.pt, pytorch_model.bin,
  adapter_model.bin): transformers loads them with `torch.load(weights_only=True)`; we check
  the same, with the numpy types its RNG state needs, BEFORE the trainer touches anything.
- DeepSpeed's states (`global_step*/...`): DeepSpeed loads them with `weights_only=False` and
  they hold DeepSpeed's own objects (its loss scaler, ZeRO stage, fragment addresses). They are
  first unpickled here with a restricted unpickler that admits an explicit list of globals (tensor
  rebuilding, torch's storages, dtypes, Size and device, the DeepSpeed classes its ZeRO states
  hold, numpy arrays) and is asked BEFORE a module is imported: no other class or function
  (os.system, builtins.eval, a torch module class, ...) can be reached, no other module imported.
- `training_args.bin` (a pickle of TrainingArguments, never loaded on resume) is removed.
Anything else is refused: PlatformError `unsafe_checkpoint`, naming the file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from .errors import PlatformError

PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt"})
NEVER_LOADED = ("training_args.bin",)
BUILTIN_CONTAINERS = frozenset({"set", "frozenset", "slice", "complex", "bytearray", "range"})


def verify_checkpoint_pickles(checkpoint: Path | None) -> list[Path]:
    """Check every pickle of the checkpoint (returns them); PlatformError on the first unsafe one."""
    if checkpoint is None:
        return []
    for name in NEVER_LOADED:
        (checkpoint / name).unlink(missing_ok=True)
    checked = []
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES):
        deepspeed_state = any(part.startswith("global_step") for part in path.relative_to(checkpoint).parts[:-1])
        try:
            _load_restricted(path) if deepspeed_state else _load_weights_only(path)
        except Exception as exc:  # noqa: BLE001 - any failure to load it safely is a refusal
            raise PlatformError(
                f"resume_from {checkpoint}: {path.relative_to(checkpoint)} does not load without running code "
                f"({type(exc).__name__}: {str(exc)[:300]}); refusing the checkpoint", code="unsafe_checkpoint") from exc
        checked.append(path)
    return checked


def _numpy_globals() -> list[Any]:
    """What transformers allowlists for its RNG state (numpy arrays and dtypes)."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _load_weights_only(path: Path) -> None:
    import torch

    with torch.serialization.safe_globals(_numpy_globals()):
        torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip(path))


def _load_restricted(path: Path) -> None:
    import torch

    torch.load(path, map_location="cpu", weights_only=False, mmap=_is_zip(path), pickle_module=_RestrictedPickle)


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


ADMITTED = frozenset({
    ("collections", "OrderedDict"), ("collections", "Counter"), ("collections", "defaultdict"),
    ("collections", "deque"),
    *(("torch._utils", f) for f in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
                                    "_rebuild_parameter_with_state", "_rebuild_device_tensor_from_numpy",
                                    "_rebuild_meta_tensor_no_storage", "_rebuild_sparse_tensor", "_rebuild_qtensor")),
    ("torch.serialization", "_get_layout"), ("torch", "Size"), ("torch", "device"), ("torch", "Tensor"),
    ("torch.nn.parameter", "Parameter"), ("torch", "UntypedStorage"),
    # what DeepSpeed's ZeRO and bf16 optimizer states pickle besides tensors and plain containers
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"), ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"), ("deepspeed.utils.tensor_fragment", "fragment_address"),
    # numpy arrays and dtypes (transformers' RNG state)
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
    ("numpy", "dtype"), ("numpy.dtypes", "UInt32DType"),
})
TORCH_STORAGES = frozenset(f"{kind}Storage" for kind in (
    "Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool", "ComplexFloat",
    "ComplexDouble", "QUInt8", "QInt8", "QInt32", "QUInt4x2", "QUInt2x4"))


def _admitted(module: str, name: str) -> bool:
    """Judged on the names alone, before anything is imported."""
    if module in ("builtins", "__builtin__"):  # protocol 2 names Python 2's module
        return name in BUILTIN_CONTAINERS
    if (module, name) in ADMITTED:
        return True
    if module == "torch":
        import torch

        return name in TORCH_STORAGES or isinstance(getattr(torch, name, None), torch.dtype)   # torch.bfloat16, ...
    return False


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _admitted(module, name):
            raise pickle.UnpicklingError(f"global {module}.{name} is not admitted in a checkpoint")
        return super().find_class(module, name)


class _RestrictedPickle:
    """A `pickle_module` for torch.load whose Unpickler admits only what `_admitted` allows."""

    Unpickler = _RestrictedUnpickler
    UnpicklingError = pickle.UnpicklingError
    load = staticmethod(lambda f, **kwargs: _RestrictedUnpickler(f, **kwargs).load())
