"""Which adapters stay in memory: an LRU budget that never evicts one in use. Pure."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

from .catalog import CapacityExhausted


class LruBudget:
    """Resident keys in least-recently-used order, plus pins (requests in flight)."""

    def __init__(self, budget: int) -> None:
        if budget < 1:
            raise ValueError("budget must be >= 1")
        self.budget = budget
        self._order: OrderedDict[Hashable, None] = OrderedDict()
        self._pins: dict[Hashable, int] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def keys(self) -> list[Hashable]:
        return list(self._order)

    def touch(self, key: Hashable) -> None:
        self._order.move_to_end(key)

    def pin(self, key: Hashable) -> None:
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: Hashable) -> None:
        left = self._pins.get(key, 0) - 1
        if left > 0:
            self._pins[key] = left
        else:
            self._pins.pop(key, None)

    def pinned(self, key: Hashable) -> bool:
        return key in self._pins

    def victims_for(self, incoming: int = 1) -> list[Hashable]:
        """The least recently used unpinned keys to drop so `incoming` more fit the budget."""
        need = len(self._order) + incoming - self.budget
        if need <= 0:
            return []
        victims = [k for k in self._order if k not in self._pins][:need]
        if len(victims) < need:
            raise CapacityExhausted(f"all {self.budget} adapter slots are in use by requests in flight; retry shortly")
        return victims

    def add(self, key: Hashable) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def remove(self, keys: Iterable[Hashable]) -> None:
        for k in keys:
            self._order.pop(k, None)
