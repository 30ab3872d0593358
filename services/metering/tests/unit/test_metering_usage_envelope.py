"""usage.metered envelopes are built without pydantic validation (handlers.usage_envelope): they
must be exactly what the validated path (make_envelope(UsageMeteredV1(...))) writes, and pass the
contract's strict validation."""

from dataclasses import replace
from decimal import Decimal

import orjson
import pytest

from whetstone.contracts import Envelope, UsageMeteredV1
from whetstone.metering.domain.billing import Charge
from whetstone.metering.domain.ledger import Entry
from whetstone.metering.usecases.metering import usage_envelope, usage_payload
from whetstone.runtime.messaging import encode, make_envelope

pytestmark = pytest.mark.unit


def charge(klass: str, sign: int = 1) -> Charge:
    return Charge(klass, sign * Decimal("7200.000001"), sign * Decimal("5820.5"), Decimal("2.45"),
                  sign * Decimal("3.961451"), sign * Decimal("4.1"), "2026-11", "premium", "2026-11", "basis")


ENTRIES = [
    Entry("job-1", "acme", "segment", "seg-1", "charge", 0, charge("charged"), "H100", 8, True, ("e1", "e2")),
    Entry("job-1", "acme", "segment", "seg-1", "reversal", 1, charge("review", -1), "H100", 8, False, ("e1",)),
    Entry("job-2", "demo", "segment", "seg-9", "charge", 2, charge("refunded"), None, 0, None, ()),
    Entry("job-1", "acme", "job", "", "charge", 0, charge("charged"), "mixed", 8, None, ("e1",), 3, "failed"),
]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.scope}-{e.entry}-{e.revision}")
def test_usage_envelope_is_what_the_validated_path_writes(entry: Entry) -> None:
    fast = usage_envelope(entry, "metering", "trace-1")
    slow = make_envelope(UsageMeteredV1(**usage_payload(entry)), producer="metering", tenant_id=entry.tenant_id, trace_id="trace-1")
    a, b = orjson.loads(encode(fast)), orjson.loads(encode(slow))
    for volatile in ("event_id", "occurred_at"):
        assert a.pop(volatile) and b.pop(volatile)
    assert a == b
    # strict (producer-side) validation of both the envelope and its payload
    env = Envelope.model_validate(orjson.loads(encode(fast)))
    assert UsageMeteredV1.model_validate(env.payload).job_id == entry.job_id


def test_usage_envelope_without_trace_gets_a_fresh_one() -> None:
    a, b = (usage_envelope(ENTRIES[0], "metering", None) for _ in range(2))
    assert a.trace_id and a.trace_id != b.trace_id and a.event_id != b.event_id


def test_usage_envelope_refuses_what_the_validated_path_refuses() -> None:
    """The envelope is not validated: the two bounds its values could break are checked by hand."""
    for entry in (replace(ENTRIES[0], job_id="j" * 257), replace(ENTRIES[0], tenant_id="t" * 129)):
        with pytest.raises(ValueError):
            make_envelope(UsageMeteredV1(**usage_payload(entry)), producer="metering", tenant_id=entry.tenant_id)
        with pytest.raises(ValueError, match="longer than the envelope allows"):
            usage_envelope(entry, "metering", None)
    assert usage_envelope(replace(ENTRIES[0], job_id="j" * 256), "metering", None).key == "j" * 256
