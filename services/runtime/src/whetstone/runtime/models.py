"""Base-model references: a catalog name, a local directory or a Hugging Face Hub id.

The sha256 pins the exact weights a job was trained from (lineage). Torch-free."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class UnknownModel(LookupError):
    pass


@dataclass(frozen=True)
class ResolvedModel:
    ref: str          # what the user asked for
    location: str     # local directory or Hub id, as from_pretrained takes it
    sha256: str       # of the weights (local) or the Hub commit (remote)
    local: bool


@lru_cache(maxsize=64)
def _weights_sha256(directory: str, fingerprint: tuple) -> str:
    h = hashlib.sha256()
    for name, _size, _mtime in fingerprint:
        h.update(name.encode() + b"\0")
        with open(Path(directory) / name, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def weights_sha256(directory: Path) -> str:
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise UnknownModel(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) in {directory}")
    fingerprint = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _weights_sha256(str(directory), fingerprint)


def resolve_model(ref: str, catalog: Path | None = None) -> ResolvedModel:
    """Catalog name -> local dir -> Hub id, in that order; UnknownModel with the reason otherwise."""
    candidates = []
    if catalog is not None and not ref.startswith(("/", ".")) and ".." not in ref:
        candidates.append(catalog / ref)
    if ref.startswith(("/", ".")):
        candidates.append(Path(ref))
    for c in candidates:
        if (c / "config.json").is_file():
            return ResolvedModel(ref, str(c.resolve()), weights_sha256(c), True)
    if _HUB_ID.match(ref):
        try:
            from huggingface_hub import HfApi  # noqa: PLC0415

            info = HfApi().model_info(ref)
        except Exception as exc:
            raise UnknownModel(f"base model {ref!r} is not in the local catalog and the Hub "
                               f"could not confirm it: {type(exc).__name__}") from exc
        return ResolvedModel(ref, ref, info.sha or "", False)
    where = f" (catalog: {catalog})" if catalog else ""
    raise UnknownModel(f"unknown base model {ref!r}: not a catalog name, local directory or Hub id{where}")
