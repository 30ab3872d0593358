"""Load a base model / tokenizer from a local directory OR a Hugging Face Hub id.

One code path (`from_pretrained(ref)`) for both; a local directory is checked first so
that a missing file gives an error naming exactly what is missing, instead of a Hub
lookup failure for a string that was meant as a path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class ModelNotFoundError(FileNotFoundError):
    """A local model reference is missing or incomplete."""


def is_local_ref(ref: str | os.PathLike[str]) -> bool:
    """True when `ref` names a local path (existing, or clearly path-shaped) rather than a Hub id."""
    text = os.fspath(ref)
    if isinstance(ref, Path) or Path(text).expanduser().exists():
        return True
    # Hub ids are "name" or "org/name"; anything else path-shaped is a local path.
    return text.startswith(("/", "./", "../", "~", ".\\")) or text.count("/") > 1 or "\\" in text


def _local_dir(ref: str | os.PathLike[str]) -> Path:
    path = Path(os.fspath(ref)).expanduser().resolve()
    if not path.exists():
        raise ModelNotFoundError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise ModelNotFoundError(f"model path {path} is not a directory")
    return path


def check_local_model_dir(ref: str | os.PathLike[str]) -> Path:
    """Resolve a local model dir, raising ModelNotFoundError naming the missing file(s)."""
    path = _local_dir(ref)
    if not (path / CONFIG_FILE).is_file():
        raise ModelNotFoundError(f"model directory {path} has no {CONFIG_FILE}")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ModelNotFoundError(f"model directory {path} has no weights (expected one of: {', '.join(WEIGHT_FILES)})")
    return path


def check_local_tokenizer_dir(ref: str | os.PathLike[str]) -> Path:
    """Resolve a local tokenizer dir, raising ModelNotFoundError naming the missing file(s)."""
    path = _local_dir(ref)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"tokenizer directory {path} has no tokenizer files (expected one of: {', '.join(TOKENIZER_FILES)})"
        )
    return path


def load_tokenizer(ref: str | os.PathLike[str], *, revision: str | None = None, **kwargs: Any):
    """AutoTokenizer for a local dir or Hub id; guarantees a pad token (falls back to EOS)."""
    from transformers import AutoTokenizer

    source = str(check_local_tokenizer_dir(ref)) if is_local_ref(ref) else str(ref)
    tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, **kwargs)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(f"tokenizer {ref} has no chat template; chat fine-tuning needs one")
    return tokenizer


def has_vision_config(model_dir: Path) -> bool:
    """A local model directory whose config.json describes a vision-language model (a vision tower)."""
    try:
        config = json.loads((model_dir / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def load_model(ref: str | os.PathLike[str], *, dtype: Any = "auto", revision: str | None = None, **kwargs: Any):
    """AutoModelForCausalLM for a local dir or Hub id. A local vision-language model (LLaVA, ...) loads
    whole with AutoModelForImageTextToText: it answers text alone with its language model, and the
    adapters trained on it keep their module names.

    `dtype`: a torch dtype, its name ("float32", "bfloat16") or "auto" (the checkpoint's).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    local = check_local_model_dir(ref) if is_local_ref(ref) else None
    auto = AutoModelForImageTextToText if local is not None and has_vision_config(local) else AutoModelForCausalLM
    return auto.from_pretrained(str(local or ref), dtype=dtype, revision=revision, **kwargs)
