"""The state kept in jsonb columns comes back exactly as it was written (datetimes to the
microsecond with their offset, Decimals digit for digit, None fields, absent objects)."""

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from whetstone.contracts.enums import ChargeClass, ErrorClass, PreemptionReason
from whetstone.metering.adapters.rows import from_json, to_json
from whetstone.metering.domain.billing import Anomaly, Charge, Start, Stop
from whetstone.metering.domain.kinds import StopKind, TerminalKind
from whetstone.metering.domain.ledger import Queued, Terminal

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 3, 9, 0, 0, 123456, tzinfo=UTC)

OBJECTS = [
    Start("e1", T0, "H100", 8, True, 3, "node-7"),
    Stop("e2", StopKind.PREEMPTED, T0 + timedelta(hours=2), checkpointed_at=T0 + timedelta(minutes=97),
         reason=PreemptionReason.SPOT_LOSS,
         reported_at=T0 + timedelta(hours=2, seconds=1)),
    Stop("e3", StopKind.FAILED, datetime(2026, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-5))),
         error_class=ErrorClass.USER, code="nan_loss"),
    Charge(ChargeClass.CHARGED, Decimal("7200.000001"), Decimal("5820.5"), Decimal("2.4500"), Decimal("3.961451"),
           Decimal("0.000000"), "2026-11", "premium", "2026-11", "checkpointed work at the spot price"),
    Anomaly("stop_before_start", "a stop for segment s1 arrived and no start, yet"),
    Queued("e4", T0, "free", None),
    Terminal("e5", TerminalKind.CANCELLED, T0, reported_at=T0),
]


@pytest.mark.parametrize("obj", OBJECTS, ids=lambda o: type(o).__name__)
def test_state_round_trips_through_json_text(obj) -> None:
    text = to_json(obj)
    assert isinstance(text, str)
    json.loads(text)  # plain JSON, castable to jsonb
    back = from_json(type(obj), text)
    assert back == obj
    for name in obj.__dataclass_fields__:  # equal values of equal types: 2.4500 keeps its digits
        assert type(getattr(back, name)) is type(getattr(obj, name))
        assert str(getattr(back, name)) == str(getattr(obj, name))


def test_absent_objects_stay_absent() -> None:
    assert to_json(None) is None
    assert from_json(Start, None) is None
