"""The versioned price table: USD per GPU-hour by GPU type, tenant tier and capacity.

A version takes effect at `effective_from` and stays until the next one; a segment is
priced with the version in effect when it started, unless its job was admitted with a
quote pinned to a version (job.queued cost_estimate["price_version"]). Versions are
never edited once published: a price change is a new version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

TIERS = ("free", "standard", "premium")


@dataclass(frozen=True)
class Rate:
    """USD per GPU-hour."""

    on_demand: Decimal
    spot: Decimal


@dataclass(frozen=True)
class PriceVersion:
    version: str
    effective_from: datetime
    rates: Mapping[str, Mapping[str, Rate]]  # gpu type -> tier -> rate

    def rate(self, gpu_type: str, tier: str) -> Rate | None:
        return self.rates.get(gpu_type, {}).get(tier)


class PriceBook:
    def __init__(self, versions: Iterable[PriceVersion]) -> None:
        self.versions = sorted(versions, key=lambda v: v.effective_from)
        self._by_name = {v.version: v for v in self.versions}
        if len(self._by_name) != len(self.versions):
            raise ValueError("duplicate price version names")

    def get(self, version: str) -> PriceVersion | None:
        return self._by_name.get(version)

    def in_effect(self, at: datetime) -> PriceVersion | None:
        current = None
        for v in self.versions:
            if v.effective_from <= at:
                current = v
        return current


def _rates(table: Mapping[str, Mapping[str, tuple[str, str]]]) -> dict[str, dict[str, Rate]]:
    return {gpu: {tier: Rate(Decimal(od), Decimal(spot)) for tier, (od, spot) in tiers.items()}
            for gpu, tiers in table.items()}


# (on-demand, spot) USD per GPU-hour. Premium pays more on demand for reserved capacity;
# spot capacity costs every tier the same.
PRICE_BOOK = PriceBook([
    PriceVersion("2026-01", datetime(2026, 1, 1, tzinfo=UTC), _rates({
        "cpu":  {"free": ("0.06", "0.03"), "standard": ("0.06", "0.03"), "premium": ("0.08", "0.03")},
        "L4":   {"free": ("0.90", "0.40"), "standard": ("0.90", "0.40"), "premium": ("1.15", "0.40")},
        "A100": {"free": ("3.40", "1.40"), "standard": ("3.40", "1.40"), "premium": ("4.25", "1.40")},
        "H100": {"free": ("6.00", "2.60"), "standard": ("6.00", "2.60"), "premium": ("7.50", "2.60")},
    })),
    PriceVersion("2026-11", datetime(2026, 11, 1, tzinfo=UTC), _rates({
        "cpu":  {"free": ("0.05", "0.02"), "standard": ("0.05", "0.02"), "premium": ("0.07", "0.02")},
        "L4":   {"free": ("0.80", "0.35"), "standard": ("0.80", "0.35"), "premium": ("1.00", "0.35")},
        "A100": {"free": ("3.00", "1.20"), "standard": ("3.00", "1.20"), "premium": ("3.75", "1.20")},
        "H100": {"free": ("5.00", "2.00"), "standard": ("5.00", "2.00"), "premium": ("6.25", "2.00")},
    })),
])
