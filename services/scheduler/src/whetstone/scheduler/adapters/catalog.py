"""What the scheduler may read about a base model without loading it: its config.json and
the size of its weight files (for the parameter count), remembered while the files stay the same."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from whetstone.runtime.models import (WEIGHT_SUFFIXES, HubEntry, ResolvedModel, UnknownModel, resolve_hub,
                                     resolve_model, tenant_reference)

from ..domain.hf_config import HfConfig

HUB_RETRY_S = 60.0   # a Hub id the Hub could not confirm is asked about again after this, not on every create


def model_facts(model: ResolvedModel) -> tuple[HfConfig | None, int | None]:
    """(config.json read into its sizes, total bytes of weight files); (None, None) for a Hub id."""
    if not model.local:
        return None, None
    directory = Path(model.location)
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    weights = sum(p.stat().st_size for p in directory.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return (HfConfig.parse(config) if isinstance(config, dict) else None), (weights or None)


@dataclass(frozen=True)
class BaseModelFacts:
    model: ResolvedModel
    config: HfConfig | None   # None: a Hub id, or no readable config.json
    weight_bytes: int | None


class ModelCatalog:
    """Resolved base models, remembered while their files stay the same (size and mtime of every
    file): resolving hashes the weights, which a submission must not pay for every time.

    What a tenant may name: a model of the operator's catalog, or a Hub id on the operator's
    allow-list (`hub_models`), resolved to a commit once and pinned for the life of the process
    (an entry `org/name@<commit>` is pinned by the operator, with no Hub call at all). Never a path."""

    def __init__(self, recheck_s: float = 2.0, hub_models: list[str] | tuple[str, ...] = ()) -> None:
        self._known: dict[tuple[str, str], tuple[tuple, BaseModelFacts]] = {}
        self._checked: dict[tuple[str, str], float] = {}   # when the files were last seen unchanged
        self.recheck_s = recheck_s
        self.hub = {e.repo_id: e for e in map(HubEntry.parse, hub_models)}
        self._pinned: dict[str, BaseModelFacts] = {}
        self._hub_failed: dict[str, tuple[float, UnknownModel]] = {}

    async def resolve(self, ref: str, catalog: Path) -> BaseModelFacts:
        """`lookup` without a thread while the files were checked within `recheck_s` (a burst of
        submissions for one base stats its directory once, not once per request). UnknownModel
        for anything a tenant may not name."""
        if tenant_reference(ref, catalog, self.hub) == "hub":
            return await self._resolve_hub(ref)
        key = (ref, str(catalog))
        known = self._known.get(key)
        if known is not None and time.monotonic() - self._checked.get(key, float("-inf")) < self.recheck_s:
            return known[1]
        return await asyncio.to_thread(self.lookup, ref, catalog)

    async def _resolve_hub(self, ref: str) -> BaseModelFacts:
        if (pinned := self._pinned.get(ref)) is not None:
            return pinned
        failed = self._hub_failed.get(ref)
        if failed is not None and time.monotonic() - failed[0] < HUB_RETRY_S:
            raise failed[1]
        try:
            model = await asyncio.to_thread(resolve_hub, self.hub[ref])
        except UnknownModel as exc:
            self._hub_failed[ref] = (time.monotonic(), exc)
            raise
        self._pinned[ref] = facts = BaseModelFacts(model, None, None)
        return facts

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
