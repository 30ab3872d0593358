"""Fair sharing of the edge: one tenant's load must not raise another's latency.

Budgets per API key and per tenant (all keys of a tenant together), and one per service shared by
all tenants, decided in memory before any upstream work, so a refusal costs microseconds:

- requests in flight towards the services: over the cap a request waits its turn in a short queue
  of its own tenant's (so a burst is smoothed, not failed), and is refused (429, `Retry-After`) only
  when that queue is full too or its turn does not come within `queue_wait_s`. A tenant thus keeps
  at most `max_in_flight_per_tenant` requests inside the services at any moment, whatever it sends;
- server-sent-event streams held open: counted apart from requests (a stream lasts minutes), never
  queued: the stream past the cap is a 429 at once, while another tenant's stream still opens;
- a request rate per tenant (`rate_refusal`), beside the per-key rate of `ratelimit.py`;
- requests in flight inside the scheduler, registry and metering, all tenants together
  (`SharedSlots`, `max_in_flight_per_service`, kept below each one's database pool): a tenant's admitted
  requests wait here, at the edge, rather than inside the service where every tenant's request
  queues for the same event loop and pool connections. One tenant holds at most
  `max_in_flight_per_service_per_tenant` of those places, so another tenant's request goes in at
  once, beside one of the flood's requests rather than several (requests in one event loop slow
  each other down), and no heavier tenant's request enters while a lighter tenant's is inside
  (for at most `hold_s`). A tenant's weight is its demand: the requests it sent to the service's
  gate (`Fairness.enter`), whether they went in, wait, or are still queued behind its own key.

The in-flight counts live in this process: with N gateway replicas behind a load balancer each
replica holds 1/N of them (`replicas`), by nature (they protect this replica's connections). The
tenant rate is shared by every replica when the gateway has a database (shared_limits.py); without
one, or while it is unreachable, each replica holds 1/N of it here (`rate_refusal`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from whetstone.runtime.errors import ApiError

from .config import GatewaySettings
from .ratelimit import RateLimiter, retry_after_header

STREAM_PATHS = ("/v1/chat/completions", "/v1/completions")   # `"stream": true` in the body asks for SSE
TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})         # what the services' query parsing reads as true


def wants_stream(path: str, query: bytes, headers: dict[str, str], body: bytes | None) -> bool:
    """Will the answer be a server-sent-event stream? Decided from the request alone: `?stream=true`
    (the jobs' event stream), `Accept: text/event-stream`, or `"stream": true` in a completion body."""
    if "text/event-stream" in headers.get("accept", ""):
        return True
    if query and any(v.strip().lower() in TRUE for v in parse_qs(query.decode("latin-1")).get("stream", [])):
        return True
    if body and path in STREAM_PATHS and b'"stream"' in body:
        try:   # only completion bodies that name the field are parsed
            parsed = json.loads(body)
        except ValueError:
            return False
        return isinstance(parsed, dict) and parsed.get("stream") is True
    return False


@dataclass
class Slots:
    """A counted budget with a bounded FIFO of waiters."""

    limit: int
    active: int = 0
    waiters: deque[asyncio.Future] = field(default_factory=deque)

    def try_take(self) -> bool:
        if self.active < self.limit and not self.waiters:
            self.active += 1
            return True
        return False

    async def take(self, max_waiting: int, wait_s: float) -> bool:
        """A slot, waiting at most `wait_s` behind at most `max_waiting` others; False: refused."""
        if self.try_take():
            return True
        if len(self.waiters) >= max_waiting or wait_s <= 0:
            return False
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        handed = False
        try:
            async with asyncio.timeout(wait_s):
                await fut
            handed = True
            return True
        except TimeoutError:
            return False
        finally:
            if not handed:
                if fut.done() and not fut.cancelled():
                    self.give()          # handed over just as we gave up: pass it on
                else:
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        self.waiters.remove(fut)

    def give(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)   # the slot passes straight to the next waiter: active unchanged
                return
        self.active -= 1

    @property
    def idle(self) -> bool:
        return self.active == 0 and not self.waiters


@dataclass
class SharedSlots:
    """One service's requests in flight, shared by every tenant. A tenant holds at most `per_tenant`
    of the `limit` places (0: all of them), so a tenant that floods keeps its surplus waiting at the
    edge and another tenant's request finds a free place at once instead of running beside the
    flood's. A tenant is lighter than another when it has fewer requests pending for the service
    (arrived at the edge's budgets, `arrive`, and not yet answered, `depart`: waiting behind its own
    key, waiting here, or inside) and less than half its demand (those arrivals, halved every
    `half_life_s`). Tenants closer than that are equals and take turns: a tenant sending at the
    others' pace with a second request in flight is no flood, and ranking equals by what they have
    pending would starve whichever one a busy moment left with more (held, it gathers more). Admissions
    would not do: a flood held to one place is admitted no faster than a steady tenant's requests, and
    would weigh the same. A tenant does not enter while a lighter
    tenant's request is inside (it waits for that one, so a light tenant's request runs beside at
    most the heavy tenant's requests already inside when it came, never one started after it), and
    a freed place goes to the waiting tenant with the fewest requests inside, then the lightest. A
    request held back only by that rule goes in after `hold_s` if a place is free: a heavy tenant is
    slowed while lighter ones are busy, never starved (nor kept past `queue_wait_s`)."""

    limit: int
    per_tenant: int = 0
    half_life_s: float = 1.0
    hold_s: float = 0.5
    clock: Callable[[], float] = time.monotonic
    active: int = 0
    inside: Counter[str] = field(default_factory=Counter)
    waiting: dict[str, deque[asyncio.Future[None]]] = field(default_factory=dict)
    use: dict[str, tuple[float, float]] = field(default_factory=dict)   # tenant -> (weight, when it was set)
    pending: Counter[str] = field(default_factory=Counter)              # tenant -> requests arrived, not answered

    def weight(self, tenant: str, now: float) -> float:
        w, at = self.use.get(tenant, (0.0, now))
        return float(w * 0.5 ** ((now - at) / self.half_life_s))

    def arrive(self, tenant: str) -> None:
        """One more request of `tenant` for this service (its demand, whether or not it goes in);
        `depart` once it is answered or refused."""
        now = self.clock()
        self.pending[tenant] += 1
        self.use[tenant] = (self.weight(tenant, now) + 1.0, now)
        if len(self.use) > 10_000:   # tenants whose use has faded are forgotten
            self.use = {t: u for t, u in self.use.items() if t in self.pending or self.weight(t, now) > 0.01}

    def depart(self, tenant: str) -> None:
        self.pending[tenant] -= 1
        if self.pending[tenant] <= 0:
            del self.pending[tenant]

    def lighter(self, tenant: str, than: str, now: float) -> bool:
        """Whether `tenant` is lighter than `than` (see the class docstring)."""
        mine, theirs = self.pending[tenant], self.pending[than]
        return mine < theirs and 2 * self.weight(tenant, now) < self.weight(than, now)

    def _has_place(self, tenant: str) -> bool:
        return self.active < self.limit and not (self.per_tenant and self.inside[tenant] >= self.per_tenant)

    def _may_enter(self, tenant: str, now: float) -> bool:
        if self.per_tenant and self.inside[tenant] >= self.per_tenant:
            return False
        return not any(self.lighter(other, tenant, now) for other in self.inside if other != tenant)

    def _next(self) -> str | None:
        """The waiting tenant the next free place goes to (None: nobody waits who may go in): of those
        with the fewest requests inside, the first to have waited that no other is lighter than."""
        now = self.clock()
        ready = [t for t in self.waiting if self._may_enter(t, now)]
        if not ready:
            return None
        fewest = min(self.inside[t] for t in ready)
        ready = [t for t in ready if self.inside[t] == fewest]
        return next((t for t in ready if not any(self.lighter(o, t, now) for o in ready if o != t)), ready[0])

    def _admit(self, tenant: str) -> None:
        self.active += 1
        self.inside[tenant] += 1

    async def take(self, tenant: str, wait_s: float) -> bool:
        if self.active < self.limit and self._may_enter(tenant, self.clock()) and self._next() is None:
            self._admit(tenant)
            return True
        if wait_s <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(tenant, deque()).append(fut)
        handed = False
        deadline = self.clock() + wait_s
        try:
            while True:
                try:
                    async with asyncio.timeout(max(0.0, min(self.hold_s, deadline - self.clock()))):
                        await asyncio.shield(fut)
                    handed = True
                    return True
                except TimeoutError:
                    if fut.done():   # handed over just as the hold ended
                        handed = not fut.cancelled()
                        return handed
                    if self.clock() >= deadline:
                        return False
                    if self._has_place(tenant) and fut is self.waiting[tenant][0]:
                        # held `hold_s` by lighter tenants' requests only: goes in beside them
                        self._unqueue(tenant, fut)
                        self._admit(tenant)
                        handed = True
                        return True
        finally:
            if not handed:
                if fut.done() and not fut.cancelled():
                    self.give(tenant)    # handed over just as we gave up: pass it on
                else:
                    fut.cancel()
                    self._unqueue(tenant, fut)

    def _unqueue(self, tenant: str, fut: asyncio.Future[None]) -> None:
        queue = self.waiting.get(tenant)
        with contextlib.suppress(ValueError):
            if queue is not None:
                queue.remove(fut)
        if queue is not None and not queue:
            del self.waiting[tenant]

    def give(self, tenant: str) -> None:
        self.inside[tenant] -= 1
        if self.inside[tenant] <= 0:
            del self.inside[tenant]
        self.active -= 1
        while self.active < self.limit and (nxt := self._next()) is not None:
            queue = self.waiting[nxt]
            fut = queue.popleft()
            if not queue:
                del self.waiting[nxt]
            if not fut.done():
                self._admit(nxt)
                fut.set_result(None)   # the place passes straight on


class Budgets:
    """Slots by name (a key id or a tenant id), created on first use, dropped when idle."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self.limit = limit
        self.slots: dict[str, Slots] = {}

    def get(self, name: str) -> Slots:
        s = self.slots.get(name)
        if s is None:
            s = self.slots[name] = Slots(self.limit())
        return s

    def release(self, name: str) -> None:
        s = self.slots[name]
        s.give()
        if s.idle:
            del self.slots[name]


@dataclass
class Ticket:
    """What an admitted request holds until its answer is sent; `release()` exactly once."""

    done: Callable[[], None]
    stream: bool
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.done()


class Fairness:
    def __init__(self, settings: GatewaySettings) -> None:
        self.s = settings
        share = max(1, settings.replicas)
        self.key_requests = Budgets(lambda: max(1, settings.max_in_flight_per_key // share))
        self.tenant_requests = Budgets(lambda: max(1, settings.max_in_flight_per_tenant // share))
        self.key_streams = Budgets(lambda: max(1, settings.max_streams_per_key // share))
        self.tenant_streams = Budgets(lambda: max(1, settings.max_streams_per_tenant // share))
        self.tenant_rates = RateLimiter(burst_s=settings.rate_limit_burst_s)
        self.services: dict[str, SharedSlots] = {}   # by service name, kept (a handful)

    def tenant_rate(self, tenant_id: str) -> float:
        rate = self.s.tenant_rate_limits.get(tenant_id, self.s.tenant_rate_limit_per_s)
        return rate / max(1, self.s.replicas)

    def rate_refusal(self, tenant_id: str, now: float) -> ApiError | None:
        """The tenant's own budget, shared by all its keys: None when the request may pass."""
        rate = self.tenant_rate(tenant_id)
        wait = self.tenant_rates.take(tenant_id, rate, now)
        if wait <= 0:
            return None
        return ApiError(429, f"Rate limit reached for this organization ({rate:g} requests/s over all its keys); "
                             f"retry after {wait:.2f}s.", type="rate_limit_error", code="rate_limit_exceeded",
                        retry=True, headers={"Retry-After": retry_after_header(wait),
                                             "x-ratelimit-limit-requests": f"{rate:g}/s"})

    def service_slots(self, service: str) -> SharedSlots | None:
        """The service's shared budget; None for a service without one (`max_in_flight_per_service`)."""
        slots = self.services.get(service)
        if slots is None and service in self.s.max_in_flight_per_service:
            limit = max(1, self.s.max_in_flight_per_service[service] // max(1, self.s.replicas))
            slots = self.services[service] = SharedSlots(limit, per_tenant=self.s.max_in_flight_per_service_per_tenant)
        return slots

    async def enter(self, key_id: str, tenant_id: str, stream: bool, service: str = "") -> Ticket | ApiError:
        """A ticket for one request (or stream), or the 429 that refuses it. A request holds, in
        order, a slot of its key, of its tenant and of its service (`SharedSlots`: a tenant past its
        fair share of the service waits at the edge, where its wait costs the others nothing)."""
        if stream:
            return self._enter_stream(key_id, tenant_id)
        shared = self.service_slots(service)
        if shared is None:
            return await self._enter_request(key_id, tenant_id, None, service)
        shared.arrive(tenant_id)   # the tenant's demand, counted before it waits behind its own key
        ticket: Ticket | ApiError | None = None
        try:
            ticket = await self._enter_request(key_id, tenant_id, shared, service)
            return ticket
        finally:
            if not isinstance(ticket, Ticket):   # refused, or the caller left: no longer pending
                shared.depart(tenant_id)

    @contextlib.contextmanager
    def pending(self, tenant_id: str, service: str) -> Iterator[None]:
        """A request of the tenant waiting for the service without a place of its own (a read joined to
        an identical one, coalesce.py): it weighs in its tenant's pending requests and demand all the same."""
        shared = self.service_slots(service)
        if shared is None:
            yield
            return
        shared.arrive(tenant_id)
        try:
            yield
        finally:
            shared.depart(tenant_id)

    async def _enter_request(self, key_id: str, tenant_id: str, shared: SharedSlots | None,
                             service: str) -> Ticket | ApiError:
        waiting, wait_s = self.s.max_queued_per_tenant, self.s.queue_wait_s
        key_slots = self.key_requests.get(key_id)
        if not await key_slots.take(waiting, wait_s):
            self._drop_if_idle(self.key_requests, key_id)
            return self._busy("this API key", key_slots.limit)
        tenant_slots = self.tenant_requests.get(tenant_id)   # looked up after the wait: idle ones are dropped
        if not await tenant_slots.take(waiting, wait_s):
            self.key_requests.release(key_id)
            self._drop_if_idle(self.tenant_requests, tenant_id)
            return self._busy("this organization", tenant_slots.limit)
        try:
            admitted = shared is None or await shared.take(tenant_id, wait_s)
        except asyncio.CancelledError:   # the caller left while waiting: its other places go back
            self.tenant_requests.release(tenant_id)
            self.key_requests.release(key_id)
            raise
        if not admitted:
            assert shared is not None
            self.tenant_requests.release(tenant_id)
            self.key_requests.release(key_id)
            return self._busy(f"the {service} service", shared.limit)

        def done() -> None:
            if shared is not None:
                shared.depart(tenant_id)   # first: the freed place goes by what is pending after it
                shared.give(tenant_id)
            self.tenant_requests.release(tenant_id)
            self.key_requests.release(key_id)
        return Ticket(done, stream=False)

    def _enter_stream(self, key_id: str, tenant_id: str) -> Ticket | ApiError:
        key_slots, tenant_slots = self.key_streams.get(key_id), self.tenant_streams.get(tenant_id)
        if not key_slots.try_take():
            self._drop_if_idle(self.key_streams, key_id)
            return self._too_many_streams("this API key", key_slots.limit)
        if not tenant_slots.try_take():
            self.key_streams.release(key_id)
            self._drop_if_idle(self.tenant_streams, tenant_id)
            return self._too_many_streams("this organization", tenant_slots.limit)

        def done() -> None:
            self.tenant_streams.release(tenant_id)
            self.key_streams.release(key_id)
        return Ticket(done, stream=True)

    @staticmethod
    def _drop_if_idle(budgets: Budgets, name: str) -> None:
        s = budgets.slots.get(name)
        if s is not None and s.idle:
            del budgets.slots[name]

    def _busy(self, whose: str, limit: int) -> ApiError:
        return ApiError(429, f"Too many concurrent requests for {whose} ({limit} in flight and "
                             f"{self.s.max_queued_per_tenant} waiting at most); retry shortly.",
                        type="rate_limit_error", code="concurrency_limit_exceeded", retry=True,
                        headers={"Retry-After": retry_after_header(max(1.0, self.s.queue_wait_s))})

    def _too_many_streams(self, whose: str, limit: int) -> ApiError:
        return ApiError(429, f"Too many open event streams for {whose} ({limit} at most); close one or read "
                             "the events with `GET ...` pages instead.", type="rate_limit_error",
                        code="stream_limit_exceeded", retry=True,
                        headers={"Retry-After": retry_after_header(math.ceil(self.s.stream_retry_after_s))})


async def until_gone(work: Awaitable[None], receive) -> None:
    """Run `work` (relaying a stream) until it ends or the caller disconnects, whichever is first: a
    stream whose reader left gives back its place (and its upstream connection) at once, not when
    the service next writes."""
    relay = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relay, watcher):
            task.cancel()
        await asyncio.gather(relay, watcher, return_exceptions=True)
    if not relay.cancelled() and relay.exception() is not None:
        raise relay.exception()
