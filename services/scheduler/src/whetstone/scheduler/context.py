"""The scheduler's typed dependencies, built once in `bootstrap.py` and read by handlers as `rt.ctx`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from whetstone.graders import GraderEnvironment

from .adapters.catalog import ModelCatalog
from .adapters.metrics import SchedulerMetrics
from .adapters.webhooks import system_resolve
from .config import SchedulerSettings
from .domain.forecast import Forecast
from .domain.policy import Policy
from .entrypoints.loop import SchedulingLoop

Clock = Callable[[], datetime]
Resolver = Callable[[str, int], Awaitable[list[str]]]   # (host, port) -> addresses


@dataclass
class SchedulerContext:
    config: SchedulerSettings
    policy: Policy
    clock: Clock                     # injected: tests and the simulator can drive time
    metrics: SchedulerMetrics
    loop: SchedulingLoop
    models: ModelCatalog             # resolved base models (weights hashed once per version)
    graders: GraderEnvironment       # the operator's grader settings, sandbox and judges (RFT, graders API)
    forecasts: dict[str, Forecast] = field(default_factory=dict)   # queue position and start, from the last cycle
    resolve_host: Resolver = system_resolve   # webhook hosts; injected in tests (a name -> a loopback receiver)
