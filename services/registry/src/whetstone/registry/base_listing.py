"""Base models as OpenAI's `/v1/models` shows them: the platform's catalog (model directories under the
model catalog, and every base a job pinned) listed after the tenant's own fine-tuned models, with
`owned_by: "whetstone"`. Chatting with one is serving's business: it answers for the base it runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .adapters.store import ModelStore

OWNER = "whetstone"


def catalog_dirs(catalog: Path) -> dict[str, int]:
    """Catalog entries (a directory with a config.json) -> created (the config's mtime, epoch seconds)."""
    try:
        entries = list(catalog.iterdir())
    except OSError:
        return {}
    return {d.name: int((d / "config.json").stat().st_mtime) for d in entries if (d / "config.json").is_file()}


def base_view(name: str, created: int, sha256: str | None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER, "model_type": "base",
            "sha256": sha256}


async def base_models(store: ModelStore, catalog: Path) -> list[dict[str, Any]]:
    """Every base the platform knows, by name."""
    known = {b["name"]: b for b in await store.bases()}
    on_disk = await asyncio.to_thread(catalog_dirs, catalog)
    views = []
    for name in sorted(set(known) | set(on_disk)):
        row = known.get(name)
        created = on_disk.get(name) or (int(row["updated_at"].timestamp()) if row and row.get("updated_at") else 0)
        views.append(base_view(name, created, row["sha256"] if row else None))
    return views


async def base_model(store: ModelStore, catalog: Path, name: str) -> dict[str, Any] | None:
    return next((b for b in await base_models(store, catalog) if b["id"] == name), None)


def page_with_bases(models: list[dict[str, Any]], more_models: bool, bases: list[dict[str, Any]], after: str | None,
                    limit: int) -> tuple[list[dict[str, Any]], bool]:
    """One page of the tenant's models (newest first) followed by the bases; `after` may name either.
    Returns (data, has_more)."""
    ids = [b["id"] for b in bases]
    if after in ids:
        rest = bases[ids.index(after) + 1:]
        return rest[:limit], len(rest) > limit
    data = models[:limit]
    if more_models:
        return data, True
    room = limit - len(data)
    return data + bases[:room], len(bases) > room
