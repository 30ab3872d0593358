"""Base-model references: a catalog name, a local directory or a Hugging Face Hub id.

The sha256 pins the exact weights a job was trained from (lineage). Torch-free.

A tenant names a base model by its catalog name or by a Hub id the operator allow-listed
(`tenant_reference`): never by a path, which `resolve_model` (operator tools, trainers) accepts."""

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
def _weights_sha256(directory: str, fingerprint: tuple[tuple[str, int, int], ...]) -> str:
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
        raise UnknownModel(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) for base model {directory.name!r}")
    fingerprint = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _weights_sha256(str(directory), fingerprint)


def is_hub_id(ref: str) -> bool:
    return bool(_HUB_ID.match(ref))


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
    raise UnknownModel(f"unknown base model {ref!r}: not a catalog name, local directory or Hub id")


_CATALOG_NAME = re.compile(r"^[A-Za-z0-9][\w.-]{0,127}(/[A-Za-z0-9][\w.-]{0,127})?$")


@dataclass(frozen=True)
class HubEntry:
    """One allow-listed Hub model: `org/name`, or `org/name@<40-hex commit>` pinned by the operator
    (then no Hub call is ever made for it: the way to use a Hub model offline)."""

    repo_id: str
    revision: str | None

    @classmethod
    def parse(cls, entry: str) -> HubEntry:
        repo_id, _, revision = entry.strip().partition("@")
        if not _HUB_ID.match(repo_id) or (revision and not re.fullmatch(r"[0-9a-f]{40}", revision)):
            raise ValueError(f"hub model allow-list entry {entry!r} is not org/name or org/name@<40-hex commit>")
        return cls(repo_id, revision or None)


def tenant_reference(ref: str, catalog: Path | None, hub_allowed: dict[str, HubEntry]) -> str:
    """How a tenant's `model` is resolved: 'catalog' (a directory the operator published under the
    catalog) or 'hub' (an allow-listed Hub id). UnknownModel otherwise, naming neither the catalog's
    place on disk nor whether a path exists."""
    refused = (f"base model {ref[:120]!r} is not offered: name a base model of the catalog (GET /v1/base_models)"
               " or a Hub id the operator allows")
    if not _CATALOG_NAME.match(ref) or ".." in ref:
        raise UnknownModel(refused + "; file-system paths are not accepted")
    if catalog is not None and (catalog / ref / "config.json").is_file():   # the name cannot leave the catalog
        return "catalog"
    if ref in hub_allowed:
        return "hub"
    raise UnknownModel(refused)


def resolve_hub(entry: HubEntry) -> ResolvedModel:
    """An allow-listed Hub id pinned to one commit: the operator's, or the Hub's answer now (one
    call; the caller keeps the answer)."""
    if entry.revision is not None:
        return ResolvedModel(entry.repo_id, entry.repo_id, entry.revision, False)
    try:
        from huggingface_hub import HfApi  # noqa: PLC0415

        info = HfApi().model_info(entry.repo_id)
    except Exception as exc:
        raise UnknownModel(f"base model {entry.repo_id!r} could not be confirmed on the Hub "
                           f"({type(exc).__name__}); an operator can pin it as {entry.repo_id}@<commit>") from exc
    if not info.sha:
        raise UnknownModel(f"the Hub gave no commit for base model {entry.repo_id!r}")
    return ResolvedModel(entry.repo_id, entry.repo_id, info.sha, False)
