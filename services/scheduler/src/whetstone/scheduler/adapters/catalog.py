"""What the scheduler may read about a base model without loading it: its config.json and
the size of its weight files (for the parameter count), remembered while the files stay the same."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whetstone.runtime.models import WEIGHT_SUFFIXES, ResolvedModel, resolve_model


def model_facts(model: ResolvedModel) -> tuple[dict[str, Any] | None, int | None]:
    """(config.json as a dict, total bytes of weight files); (None, None) for a Hub id."""
    if not model.local:
        return None, None
    directory = Path(model.location)
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    weights = sum(p.stat().st_size for p in directory.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return (config if isinstance(config, dict) else None), (weights or None)


@dataclass(frozen=True)
class BaseModelFacts:
    model: ResolvedModel
    config: dict[str, Any] | None
    weight_bytes: int | None


class ModelCatalog:
    """Resolved base models, remembered while their files stay the same (size and mtime of every
    file): resolving hashes the weights, which a submission must not pay for every time."""

    def __init__(self, recheck_s: float = 2.0) -> None:
        self._known: dict[tuple[str, str], tuple[tuple, BaseModelFacts]] = {}
        self._checked: dict[tuple[str, str], float] = {}   # when the files were last seen unchanged
        self.recheck_s = recheck_s

    async def resolve(self, ref: str, catalog: Path) -> BaseModelFacts:
        """`lookup` without a thread while the files were checked within `recheck_s` (a burst of
        submissions for one base stats its directory once, not once per request)."""
        key = (ref, str(catalog))
        known = self._known.get(key)
        if known is not None and time.monotonic() - self._checked.get(key, float("-inf")) < self.recheck_s:
            return known[1]
        return await asyncio.to_thread(self.lookup, ref, catalog)

    def lookup(self, ref: str, catalog: Path) -> BaseModelFacts:
        """Blocking (stats, maybe hashing): run it in a thread. UnknownModel when it is nowhere."""
        signature = _signature(ref, catalog)
        known = self._known.get((ref, str(catalog)))
        if known is not None and signature is not None and known[0] == signature:
            self._checked[(ref, str(catalog))] = time.monotonic()
            return known[1]
        model = resolve_model(ref, catalog)
        config, weights = model_facts(model)
        facts = BaseModelFacts(model, config, weights)
        if signature is not None:
            self._known[(ref, str(catalog))] = (signature, facts)
            self._checked[(ref, str(catalog))] = time.monotonic()
        return facts


def _signature(ref: str, catalog: Path) -> tuple | None:
    for directory in ([catalog / ref] if not ref.startswith(("/", ".")) and ".." not in ref else []) + \
            ([Path(ref)] if ref.startswith(("/", ".")) else []):
        if (directory / "config.json").is_file():
            return tuple(sorted((p.name, st.st_size, st.st_mtime_ns) for p in directory.iterdir()
                                if p.is_file() and (st := p.stat())))
    return None
