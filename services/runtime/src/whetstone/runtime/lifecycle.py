"""How a service's background tasks are kept running and how its stop is bounded.

`supervise` restarts a background task that failed (a second later): a bug logs its traceback, an
unreachable dependency (PostgreSQL restarting, the broker away) one warning line. `bounded` runs one
step of a stop under a time limit, so one stuck part (a consumer mid-rebalance, a task deaf to its
cancellation) cannot use the whole 30 s a pod gets after SIGTERM; a step cut short is named."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

from .delivery import unavailable_dependency


async def supervise(rt: Any, bg: Callable[[Any], Awaitable[None]]) -> None:
    while True:
        try:
            await bg(rt)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if (dependency := unavailable_dependency(exc)) is None:
                rt.log.exception("background task crashed; restarting", task=bg.__name__)
            else:  # expected while it is away: retried without a traceback
                rt.log.warning("background task retrying", task=bg.__name__, unreachable=dependency,
                               error=f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(1)


async def bounded(log: Any, overran: list[str], what: str, step: Awaitable[Any], timeout_s: float | None,
                  quiet: bool = False) -> bool:
    """True when `step` finished in time; a step cut short is logged and appended to `overran`; a failed
    one is logged unless `quiet` (a last flush that may fail)."""
    try:
        await asyncio.wait_for(step, timeout=timeout_s)
        return True
    except TimeoutError:
        overran.append(what)
        log.warning("stopping: step overran; left behind", step=what, timeout_s=timeout_s)
    except Exception:
        if not quiet:
            log.exception("stopping: step failed", step=what)
    return False


def freeze_startup_objects() -> None:
    """Once a service process is up, move everything alive (modules, apps, pools, consumers: they
    live as long as the process) out of the cyclic collector's sight, so a full collection walks only
    what requests and events made since instead of stopping the event loop for the whole heap (46 ms
    in the gateway at a burst of requests on this machine). Only for a process of its own: nothing of
    a caller's should be frozen with it."""
    gc.collect()
    gc.freeze()
