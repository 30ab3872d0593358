"""The metering service's dependencies, built once by `bootstrap.build_service`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .adapters.cache import StateCache
from .adapters.metrics import UsageMetrics
from .config import MeteringSettings
from .domain.clock import EventClock
from .domain.ledger import Policy


@dataclass
class MeteringContext:
    config: MeteringSettings
    # The tenants' tiers come from the platform settings and the Prometheus registry from the
    # running service: both are bound once, in `bootstrap.on_start`, before any message.
    policy: Policy | None = None
    usage_metrics: UsageMetrics | None = None
    event_clock: EventClock = field(default_factory=EventClock)
    state_cache: StateCache | None = None
