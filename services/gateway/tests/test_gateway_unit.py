import pytest

from whetstone.gateway.ratelimit import RateLimiter, retry_after_header
from whetstone.gateway.routing import bearer, owner_of

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path,owner", [
    ("/v1/files", "ingest"), ("/v1/files/ds-1/content", "ingest"), ("/v1/fine_tuning/jobs", "scheduler"),
    ("/v1/keys/abc/revoke", "scheduler"), ("/v1/models/m-1", "registry"), ("/v1/base_models", "registry"),
    ("/v1/chat/completions", "serving"), ("/v1/usage/jobs/x", "metering"), ("/v1/filesystem", None),
    ("/internal/keys/verify", None), ("/v1/files/../keys", None), ("/metrics", None), ("/v1//files", None),
])
def test_owner_of(path, owner):
    assert owner_of(path) == owner


def test_bearer():
    assert bearer("Bearer wsk-1") == "wsk-1"
    assert bearer("bearer   wsk-1 ") == "wsk-1"
    assert bearer("Basic abc") is None and bearer("Bearer ") is None and bearer(None) is None


def test_token_bucket_refills_at_the_key_rate():
    rl = RateLimiter(burst_s=2.0)
    assert [rl.take("k", 1.0, 0.0) for _ in range(2)] == [0.0, 0.0]  # burst of 2
    wait = rl.take("k", 1.0, 0.0)
    assert wait == pytest.approx(1.0)
    assert retry_after_header(wait) == "1"
    assert rl.take("other", 1.0, 0.0) == 0.0  # buckets are per key
    assert rl.take("k", 1.0, 0.5) == pytest.approx(0.5)
    assert rl.take("k", 1.0, 1.0) == 0.0


async def test_a_key_in_use_is_verified_again_in_the_background_and_revocation_still_holds():
    """A valid verdict past the first quarter of its 2 s is answered at once and refreshed behind the
    request; a revocation seen by that refresh applies from then on, never later than the 2 s."""
    import asyncio

    from whetstone.gateway.auth import KeyVerifier, Verdict

    now = [0.0]
    answers: list[Verdict | None] = [Verdict("k1", "demo", ("read",), None)]

    class Counting(KeyVerifier):
        asked = 0

        async def _ask(self, key: str) -> Verdict | None:
            self.asked += 1
            await asyncio.sleep(0.01)
            return answers[-1]

    keys = Counting(lambda: None, "http://scheduler/internal/keys/verify", ttl_s=2.0, clock=lambda: now[0])
    assert (await keys.verify("wsk-a")).tenant_id == "demo" and keys.asked == 1
    now[0] = 0.4
    assert (await keys.verify("wsk-a")) is not None and keys.asked == 1          # fresh: no question
    now[0] = 1.5
    assert (await keys.verify("wsk-a")) is not None and keys.asked == 1          # answered from the cache...
    await asyncio.sleep(0.05)
    assert keys.asked == 2                                                        # ...and asked again behind it
    answers.append(None)                                                          # revoked now
    now[0] = 3.0                                                                  # the refreshed verdict: valid to 3.5
    assert (await keys.verify("wsk-a")) is not None
    await asyncio.sleep(0.05)                                                     # its refresh sees the revocation
    assert keys.asked == 3 and await keys.verify("wsk-a") is None and not keys.refreshing


async def test_a_burst_of_one_keys_requests_refreshes_its_verdict_once():
    """Fifty requests of one key arriving in the same turn of the loop, past the verdict's first
    quarter: all are answered from the cache and the key service is asked once behind them, not once
    per request (a tenant's burst would otherwise become a burst on the key service that every
    tenant's requests wait behind)."""
    import asyncio

    from whetstone.gateway.auth import KeyVerifier, Verdict

    now = [0.0]

    class Counting(KeyVerifier):
        asked = 0

        async def _ask(self, key: str) -> Verdict | None:
            self.asked += 1
            await asyncio.sleep(0.01)
            return Verdict("k1", "demo", ("read",), None)

    keys = Counting(lambda: None, "http://scheduler/internal/keys/verify", ttl_s=2.0, clock=lambda: now[0])
    await keys.verify("wsk-a")
    now[0] = 1.5
    verdicts = await asyncio.gather(*(keys.verify("wsk-a") for _ in range(50)))
    await asyncio.sleep(0.05)
    assert all(v is not None and v.tenant_id == "demo" for v in verdicts)
    assert keys.asked == 2 and not keys.refreshing and not keys.pending
    now[0] = 10.0                                                 # expired: a burst of misses asks once too
    await asyncio.gather(*(keys.verify("wsk-a") for _ in range(50)))
    assert keys.asked == 3 and not keys.pending


def test_start_up_objects_are_frozen_out_of_full_collections():
    """After start-up the cyclic collector no longer walks what start-up made: its oldest generation
    holds (almost) nothing, so a full collection during a burst of requests stops the loop briefly."""
    import gc

    from whetstone.runtime.lifecycle import freeze_startup_objects

    before = len(gc.get_objects(generation=2))
    try:
        freeze_startup_objects()
        assert before > 1000 and gc.get_freeze_count() > 1000   # the collect first frees some of `before`
        assert len(gc.get_objects(generation=2)) < before / 100
    finally:
        gc.unfreeze()   # the test process goes on collecting as before
