"""observe_many: a batch's handler time counted for each of its events in one step."""

from prometheus_client import CollectorRegistry, Histogram

from whetstone.runtime.batching import observe_many


def samples(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")}


def test_observe_many_is_n_observations() -> None:
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("h", "h", ["topic"], registry=one, buckets=(0.01, 0.1, 1))
    h2 = Histogram("h", "h", ["topic"], registry=many, buckets=(0.01, 0.1, 1))
    for amount, n in ((0.05, 3), (0.5, 7), (2.0, 2), (0.01, 4)):
        for _ in range(n):
            h1.labels(topic="t").observe(amount)
        observe_many(h2.labels(topic="t"), amount, n)
    assert samples(one).keys() == samples(many).keys()
    for key, value in samples(one).items():
        assert abs(samples(many)[key] - value) < 1e-9, key
