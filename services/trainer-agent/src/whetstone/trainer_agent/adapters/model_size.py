"""How many parameters a base model has, read from its local safetensors headers (no torch)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from ..domain.distributed import param_count_hint

BYTES_PER_PARAM_GUESS = 2.0   # .bin / .pt weights without a readable header: assume 16-bit


def safetensors_params(path: Path) -> int:
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def param_count(location: str) -> float | None:
    """Exact for local safetensors, estimated from file sizes for other local weights, read off
    the name for Hub ids; None when nothing tells."""
    directory = Path(location)
    if not directory.is_dir():
        return param_count_hint(location)
    tensors = sorted(directory.glob("*.safetensors"))
    if tensors:
        return float(sum(safetensors_params(p) for p in tensors))
    others = [p for p in directory.iterdir() if p.suffix in (".bin", ".pt")]
    if others:
        return sum(p.stat().st_size for p in others) / BYTES_PER_PARAM_GUESS
    return param_count_hint(directory.name)
