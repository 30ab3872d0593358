"""Base models as OpenAI's `/v1/models` shows them: the platform's catalog (model directories under the
model catalog, and every base a job pinned) listed after the tenant's own fine-tuned models, with
`owned_by: "whetstone"`. Chatting with one is serving's business: it answers for the base it runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from ..adapters.store import ModelStore

OWNER = "whetstone"
M = TypeVar("M")


@dataclass(frozen=True)
class BaseListing:
    """A base model as an entry of `/v1/models`."""

    id: str
    created: int
    sha256: str | None
    object: Literal["model"] = "model"
    owned_by: str = OWNER
    model_type: Literal["base"] = "base"


def catalog_dirs(catalog: Path) -> dict[str, int]:
    """Catalog entries (a directory with a config.json) -> created (the config's mtime, epoch seconds)."""
    try:
        entries = list(catalog.iterdir())
    except OSError:
        return {}
    return {d.name: int((d / "config.json").stat().st_mtime) for d in entries if (d / "config.json").is_file()}


async def base_models(store: ModelStore, catalog: Path) -> list[BaseListing]:
    """Every base the platform knows, by name."""
    known = {b.name: b for b in await store.bases()}
    on_disk = await asyncio.to_thread(catalog_dirs, catalog)
    views = []
    for name in sorted(set(known) | set(on_disk)):
        entry = known.get(name)
        created = on_disk.get(name) or (int(entry.updated_at.timestamp()) if entry else 0)
        views.append(BaseListing(name, created, entry.sha256 if entry else None))
    return views


async def base_model(store: ModelStore, catalog: Path, name: str) -> BaseListing | None:
    return next((b for b in await base_models(store, catalog) if b.id == name), None)


def page_with_bases(models: list[M], more_models: bool, bases: list[BaseListing], after: str | None,
                    limit: int) -> tuple[list[M | BaseListing], bool]:
    """One page of the tenant's models (newest first) followed by the bases; `after` may name either.
    Returns (data, has_more)."""
    ids = [b.id for b in bases]
    if after in ids:
        rest = bases[ids.index(after) + 1:]
        return list(rest[:limit]), len(rest) > limit
    data: list[M | BaseListing] = list(models[:limit])
    if more_models:
        return data, True
    room = limit - len(data)
    return data + bases[:room], len(bases) > room
