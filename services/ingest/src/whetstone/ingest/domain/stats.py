"""Dataset statistics: token-length histogram and summary, role and turn counts. Pure.

Lengths are kept as compact int32 chunks (4 bytes per row) so percentiles are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TOKEN_EDGES = (0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
OUTLIER_FACTOR = 8


@dataclass(frozen=True)
class Bucket:
    """Rows whose token length is in [min, max); `max` None: the open-ended last bucket."""
    min: int
    max: int | None
    count: int


def histogram(lengths: np.ndarray, edges: tuple[int, ...] = TOKEN_EDGES) -> list[Bucket]:
    """Buckets [lo, hi) with their counts; the last bucket is open-ended."""
    idx = np.searchsorted(np.asarray(edges), lengths, side="right") - 1
    counts = np.bincount(idx, minlength=len(edges))
    last = int(idx.max()) if idx.size else 0
    out: list[Bucket] = []
    for i, lo in enumerate(edges[: last + 1]):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        out.append(Bucket(lo, hi, int(counts[i])))
    return out


def _turn_bucket(turns: int) -> str:
    return str(turns) if turns <= 8 else "9+"


@dataclass(frozen=True)
class StatsSummary:
    """The report's `stats`: token lengths (rows, total, min, mean, p50, p90, p99, max), their histogram,
    messages per role, rows per number of turns, tokens trained on, rows over 8x the median length."""

    tokens: dict[str, int | float]
    token_histogram: list[Bucket]
    roles: dict[str, int]
    turns: dict[str, int]
    trained_tokens: int
    length_outliers: int


@dataclass
class DatasetStats:
    lengths: list[np.ndarray] = field(default_factory=list)
    _pending: list[int] = field(default_factory=list)
    roles: dict[str, int] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    trained_tokens: int = 0

    def add(self, tokens: int, roles: dict[str, int], trained: int = 0) -> None:
        self._pending.append(tokens)
        if len(self._pending) >= 65536:
            self._flush()
        for role, n in roles.items():
            self.roles[role] = self.roles.get(role, 0) + n
        bucket = _turn_bucket(sum(roles.values()))
        self.turns[bucket] = self.turns.get(bucket, 0) + 1
        self.trained_tokens += trained

    def _flush(self) -> None:
        if self._pending:
            self.lengths.append(np.asarray(self._pending, dtype=np.int32))
            self._pending = []

    def all_lengths(self) -> np.ndarray:
        self._flush()
        return np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int32)

    @property
    def tokens_total(self) -> int:
        return int(self.all_lengths().sum(dtype=np.int64))

    def outliers(self) -> int:
        lengths = self.all_lengths()
        if not lengths.size:
            return 0
        return int((lengths > OUTLIER_FACTOR * max(1.0, float(np.median(lengths)))).sum())

    def summary(self) -> StatsSummary:
        lengths = self.all_lengths()
        if lengths.size:
            p50, p90, p99 = (int(x) for x in np.percentile(lengths, [50, 90, 99], method="nearest"))
            tokens = {"rows": int(lengths.size), "total": int(lengths.sum(dtype=np.int64)), "min": int(lengths.min()),
                      "mean": round(float(lengths.mean()), 1), "p50": p50, "p90": p90, "p99": p99,
                      "max": int(lengths.max())}
        else:
            tokens = {"rows": 0, "total": 0}
        return StatsSummary(tokens, histogram(lengths), dict(sorted(self.roles.items())),
                            dict(sorted(self.turns.items(), key=lambda kv: (len(kv[0]), kv[0]))), self.trained_tokens,
                            self.outliers())
