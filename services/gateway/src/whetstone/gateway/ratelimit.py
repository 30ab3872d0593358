"""Per-key token buckets. Pure: the clock is passed in."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """`rate` requests per second per key, bursts up to `rate * burst_s` (at least 1)."""

    def __init__(self, burst_s: float = 2.0, max_keys: int = 100_000) -> None:
        self.burst_s, self.max_keys = burst_s, max_keys
        self.buckets: dict[str, Bucket] = {}

    def take(self, key: str, rate: float, now: float) -> float:
        """0 when the request may pass; otherwise the seconds to wait before one token is there."""
        capacity = max(rate * self.burst_s, 1.0)
        b = self.buckets.get(key)
        if b is None:
            if len(self.buckets) >= self.max_keys:
                self.buckets.clear()  # crude bound; a full bucket per key is the safe default
            b = self.buckets[key] = Bucket(capacity, now)
        b.tokens = min(capacity, b.tokens + (now - b.updated) * rate)
        b.updated = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return 0.0
        return (1.0 - b.tokens) / rate


def retry_after_header(wait_s: float) -> str:
    return str(max(1, math.ceil(wait_s)))
