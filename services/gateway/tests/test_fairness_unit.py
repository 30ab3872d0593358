"""The edge's budgets in memory (fairness.py): a burst waits its turn and everyone is served, a
full queue is refused at once, a waiter that waited too long is refused and leaves nothing
behind, and what counts as a stream matches what the services stream."""

import asyncio
import time

import pytest

from whetstone.gateway.config import GatewaySettings
from whetstone.gateway.fairness import Fairness, Ticket, wants_stream

pytestmark = pytest.mark.unit


async def test_a_burst_waits_its_turn_and_every_slot_comes_back():
    fair = Fairness(GatewaySettings(max_in_flight_per_key=2, max_in_flight_per_tenant=3, max_queued_per_tenant=64))
    inside, most = 0, 0

    async def one(key: str) -> int:
        nonlocal inside, most
        ticket = await fair.enter(key, "b", stream=False)
        if not isinstance(ticket, Ticket):
            return ticket.status
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.005)
        inside -= 1
        ticket.release()
        return 200

    codes = await asyncio.gather(*(one(f"k{i % 2}") for i in range(50)))
    assert codes == [200] * 50 and most == 3     # never more than the tenant's 3 inside, all served
    assert fair.key_requests.slots == {} and fair.tenant_requests.slots == {}


async def test_a_full_queue_or_a_long_wait_is_a_429_and_leaves_nothing():
    fair = Fairness(GatewaySettings(max_in_flight_per_key=1, max_in_flight_per_tenant=1, max_queued_per_tenant=1,
                                    queue_wait_s=0.2))
    held = await fair.enter("k", "b", stream=False)
    assert isinstance(held, Ticket)
    waiter = asyncio.create_task(fair.enter("k", "b", stream=False))
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    full = await fair.enter("k", "b", stream=False)          # one waits already: refused at once
    assert full.status == 429 and full.code == "concurrency_limit_exceeded" and time.perf_counter() - started < 0.05
    timed_out = await waiter
    assert timed_out.status == 429 and "Retry-After" in timed_out.headers
    assert isinstance(await fair.enter("a", "other", stream=False), Ticket)   # another tenant: its own budget
    held.release()
    held.release()                                           # twice is once
    assert "b" not in fair.tenant_requests.slots and "k" not in fair.key_requests.slots


async def test_a_freed_service_place_goes_to_the_tenant_with_fewest_inside():
    """B floods: it never has more than the service's 2 places, and when one frees, A's request
    (nothing inside) goes before B's six that waited longer."""
    fair = Fairness(GatewaySettings(max_in_flight_per_service={"scheduler": 2}, max_in_flight_per_key=100,
                                    max_in_flight_per_tenant=100, queue_wait_s=5,
                                    max_in_flight_per_service_per_tenant=0))
    b_inside = [await fair.enter("kb", "b", stream=False, service="scheduler") for _ in range(2)]
    assert all(isinstance(t, Ticket) for t in b_inside)
    b_waiting = [asyncio.create_task(fair.enter("kb", "b", stream=False, service="scheduler")) for _ in range(6)]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in b_waiting)                  # B is held at the edge, not in the service
    a = asyncio.create_task(fair.enter("ka", "a", stream=False, service="scheduler"))
    await asyncio.sleep(0.01)
    b_inside.pop().release()
    await asyncio.sleep(0.01)
    assert a.done() and isinstance(a.result(), Ticket) and not any(t.done() for t in b_waiting)
    other = await fair.enter("kb", "b", stream=False, service="ingest")   # a service without a shared cap
    assert isinstance(other, Ticket)
    a.result().release()                                         # A leaves: B's oldest waiter goes in
    await asyncio.sleep(0.01)
    assert [t.done() for t in b_waiting] == [True, False, False, False, False, False]
    for t in [*b_inside, other, b_waiting[0].result()]:
        t.release()
    for t in b_waiting[1:]:
        t.cancel()
    await asyncio.gather(*b_waiting[1:], return_exceptions=True)
    await asyncio.sleep(0.01)
    shared = fair.services["scheduler"]
    assert shared.waiting == {} and sum(shared.inside.values()) == shared.active


async def test_a_tenant_holds_its_share_of_a_service_and_equals_take_turns():
    """One place each (the default share): B's flood keeps one place and its surplus waits, so A
    goes in at once beside it; with one place in all, a tie between A and B (nothing inside either)
    goes to the tenant whose last turn is oldest, so A waits for one of B's requests, not all."""
    fair = Fairness(GatewaySettings(max_in_flight_per_service={"scheduler": 4}, max_in_flight_per_key=100,
                                    max_in_flight_per_tenant=100, queue_wait_s=5))
    first_b = await fair.enter("kb", "b", stream=False, service="scheduler")
    b_waiting = [asyncio.create_task(fair.enter("kb", "b", stream=False, service="scheduler")) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert isinstance(first_b, Ticket) and not any(t.done() for t in b_waiting)   # B: one place, 3 stay free
    a = await asyncio.wait_for(fair.enter("ka", "a", stream=False, service="scheduler"), 0.5)
    assert isinstance(a, Ticket) and fair.services["scheduler"].active == 2
    a.release()
    first_b.release()
    for t in b_waiting:
        (await t).release()
    shared = fair.services["scheduler"]
    assert shared.active == 0 and not shared.inside and not shared.waiting

    one = Fairness(GatewaySettings(max_in_flight_per_service={"scheduler": 1}, max_in_flight_per_key=100,
                                   max_in_flight_per_tenant=100, queue_wait_s=5))
    order: list[str] = []

    async def request(key: str, tenant: str) -> None:
        ticket = await one.enter(key, tenant, stream=False, service="scheduler")
        assert isinstance(ticket, Ticket)
        order.append(tenant)
        await asyncio.sleep(0.002)
        ticket.release()

    b_flood = [asyncio.create_task(request("kb", "b")) for _ in range(6)]
    await asyncio.sleep(0)          # B's six wait (one inside)
    a_one = asyncio.create_task(request("ka", "a"))
    await asyncio.gather(*b_flood, a_one)
    assert order.index("a") <= 2, order   # after B's request inside and at most one more, not after all six


async def test_a_heavier_tenant_does_not_enter_beside_a_lighter_ones_request():
    """B has used the service more (three requests); once A's request is inside, B's next waits for
    it although places are free, and goes in as soon as A's is done."""
    fair = Fairness(GatewaySettings(max_in_flight_per_service={"scheduler": 4}, max_in_flight_per_key=100,
                                    max_in_flight_per_tenant=100, queue_wait_s=5,
                                    max_in_flight_per_service_per_tenant=2))
    for _ in range(3):
        (await fair.enter("kb", "b", stream=False, service="scheduler")).release()
    b_inside = await fair.enter("kb", "b", stream=False, service="scheduler")
    a = await asyncio.wait_for(fair.enter("ka", "a", stream=False, service="scheduler"), 0.5)
    assert isinstance(a, Ticket) and isinstance(b_inside, Ticket)   # the lighter one goes in beside B's
    b_next = asyncio.create_task(fair.enter("kb", "b", stream=False, service="scheduler"))
    await asyncio.sleep(0.02)
    assert not b_next.done() and fair.services["scheduler"].active == 2   # 2 of 4 places free, B under its cap
    a.release()
    assert isinstance(await asyncio.wait_for(b_next, 0.5), Ticket)
    b_next.result().release()
    b_inside.release()
    assert fair.services["scheduler"].active == 0


async def test_a_flood_is_heavier_than_a_steady_tenant_that_has_used_the_service_more():
    """Weight is what a tenant has pending (sent, not answered) and its recent demand; not its
    admissions. A used the service ten times a few seconds ago; B's flood is held to one place, so it
    has been admitted less. A's request still goes in at once beside B's, and B's next waits for A's;
    by admissions A would be the heavier one and wait behind B's flood."""
    fair = Fairness(GatewaySettings(max_in_flight_per_service={"scheduler": 4}, max_in_flight_per_key=100,
                                    max_in_flight_per_tenant=100, queue_wait_s=5))
    now = [0.0]
    fair.service_slots("scheduler").clock = lambda: now[0]
    for _ in range(10):
        (await fair.enter("ka", "a", stream=False, service="scheduler")).release()
    now[0] = 4.0   # four half-lives later: A's demand is 10/16 of a request
    b_first = await fair.enter("kb", "b", stream=False, service="scheduler")
    b_waiting = [asyncio.create_task(fair.enter("kb", "b", stream=False, service="scheduler")) for _ in range(5)]
    await asyncio.sleep(0.01)
    a = await asyncio.wait_for(fair.enter("ka", "a", stream=False, service="scheduler"), 0.05)
    assert isinstance(a, Ticket) and isinstance(b_first, Ticket)
    b_first.release()
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in b_waiting)            # A (one pending) is inside: B's (five) wait
    a.release()
    for t in b_waiting:
        (await asyncio.wait_for(t, 1)).release()
    shared = fair.services["scheduler"]
    assert shared.active == 0 and not shared.pending and not shared.waiting


async def test_a_heavy_tenant_held_back_by_lighter_ones_goes_in_after_the_hold():
    """Never starved: while A's request stays inside, B's next waits `hold_s`, then goes in beside it."""
    fair = Fairness(GatewaySettings(max_in_flight_per_service={"scheduler": 4}, max_in_flight_per_key=100,
                                    max_in_flight_per_tenant=100, queue_wait_s=5,
                                    max_in_flight_per_service_per_tenant=2))
    fair.service_slots("scheduler").hold_s = 0.1
    for _ in range(3):
        (await fair.enter("kb", "b", stream=False, service="scheduler")).release()
    b_inside = await fair.enter("kb", "b", stream=False, service="scheduler")
    a = await fair.enter("ka", "a", stream=False, service="scheduler")
    started = time.perf_counter()
    b_next = await asyncio.wait_for(fair.enter("kb", "b", stream=False, service="scheduler"), 2)
    assert isinstance(b_next, Ticket) and 0.08 <= time.perf_counter() - started < 1.5
    for ticket in (a, b_next, b_inside):
        ticket.release()
    shared = fair.services["scheduler"]
    assert shared.active == 0 and not shared.pending and not shared.waiting


async def test_a_second_request_of_a_tenant_at_the_others_pace_is_not_held():
    """Equals take turns: A and B have each sent two requests; B's second is in flight beside its first
    while A has one pending. That is no flood: it goes in beside A's at once, not after the hold (a
    saturated service would otherwise keep it waiting while any tenant with one request waits)."""
    fair = Fairness(GatewaySettings(max_in_flight_per_service={"scheduler": 4}, max_in_flight_per_key=100,
                                    max_in_flight_per_tenant=100, queue_wait_s=5,
                                    max_in_flight_per_service_per_tenant=2))
    fair.service_slots("scheduler").hold_s = 1.0
    (await fair.enter("ka", "a", stream=False, service="scheduler")).release()
    a = await fair.enter("ka", "a", stream=False, service="scheduler")
    b_first = await fair.enter("kb", "b", stream=False, service="scheduler")
    b_second = await asyncio.wait_for(fair.enter("kb", "b", stream=False, service="scheduler"), 0.5)
    assert isinstance(b_second, Ticket)
    for ticket in (a, b_first, b_second):
        ticket.release()
    assert fair.services["scheduler"].active == 0


async def test_streams_have_their_own_cap_per_key_and_tenant():
    fair = Fairness(GatewaySettings(max_streams_per_key=1, max_streams_per_tenant=2, max_in_flight_per_tenant=1))
    first = await fair.enter("k1", "b", stream=True)
    assert (await fair.enter("k1", "b", stream=True)).code == "stream_limit_exceeded"     # the key's one
    assert isinstance(await fair.enter("k2", "b", stream=True), Ticket)
    assert (await fair.enter("k3", "b", stream=True)).code == "stream_limit_exceeded"     # the tenant's two
    assert isinstance(await fair.enter("k3", "b", stream=False), Ticket)   # requests are counted apart
    first.release()
    assert isinstance(await fair.enter("k3", "b", stream=True), Ticket)


def test_what_is_a_stream():
    assert wants_stream("/v1/fine_tuning/jobs/x/events", b"stream=true", {}, None)
    assert wants_stream("/v1/fine_tuning/jobs/x/events", b"after=3&stream=Yes", {}, None)
    assert not wants_stream("/v1/fine_tuning/jobs/x/events", b"stream=false", {}, None)
    assert wants_stream("/v1/models", b"", {"accept": "text/event-stream"}, None)
    assert wants_stream("/v1/chat/completions", b"", {}, b'{"model": "m", "stream": true}')
    assert not wants_stream("/v1/chat/completions", b"", {}, b'{"model": "m", "stream": false}')
    assert not wants_stream("/v1/fine_tuning/jobs", b"", {}, b'{"suffix": "\\"stream\\""}')


def test_the_tenant_rate_is_shared_by_its_keys_and_split_over_replicas():
    fair = Fairness(GatewaySettings(tenant_rate_limit_per_s=4, rate_limit_burst_s=1, replicas=2,
                                    tenant_rate_limits={"big": 100}))
    assert fair.tenant_rate("b") == 2 and fair.tenant_rate("big") == 50
    answers = [fair.rate_refusal("b", 10.0) for _ in range(3)]
    assert answers[:2] == [None, None] and answers[2].status == 429 and answers[2].code == "rate_limit_exceeded"


async def test_a_shared_rate_lease_is_topped_up_behind_the_requests():
    """At 10/s with 1 s leases (10 tokens) only the first request waits for the shared bucket: the
    lease is topped up in the background once half spent, and no more is passed than was granted."""
    from whetstone.gateway.shared_limits import SharedTenantRates

    class SlowBucket:
        def __init__(self) -> None:
            self.tokens, self.in_request = 100, 0

        async def take(self, tenant_id: str, rate: float, capacity: float, want: int) -> tuple[int, float]:
            if asyncio.current_task() not in rates.background:
                self.in_request += 1        # a request waits for this one
            await asyncio.sleep(0.02)
            granted = min(want, self.tokens)
            self.tokens -= granted
            return granted, float(self.tokens)

    bucket = SlowBucket()
    rates = SharedTenantRates(bucket, GatewaySettings(shared_rate_lease_s=1.0), fallback=lambda t, now: None)
    for _ in range(30):
        assert await rates.refusal("b", 10.0) is None
        await asyncio.sleep(0.005)
    assert bucket.in_request == 1 and 100 - bucket.tokens >= 30, (bucket.in_request, bucket.tokens)
