"""Segment billing rules: prices, refund classes, preemption, anomalies."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from whetstone.contracts.enums import PreemptionReason
from whetstone.metering.domain.billing import (
    Anomaly, Charge, Pricing, Start, Stop, bill_segment, pick_start, pick_stop, seconds_between,
)

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)  # price version 2026-11
STANDARD = Pricing(tier="standard")


def start(gpu="A100", count=2, spot=False, at=T0, event="e-start") -> Start:
    return Start(event, at, gpu, count, spot, 1, "n1")


def stop(kind="completed", hours=1.0, error_class=None, checkpoint_hours=None, event="e-stop") -> Stop:
    ck = T0 + timedelta(hours=checkpoint_hours) if checkpoint_hours is not None else None
    return Stop(event, kind, T0 + timedelta(hours=hours), error_class=error_class, checkpointed_at=ck)


def charge(s: Start, e: Stop, pricing: Pricing = STANDARD) -> Charge:
    c = bill_segment(s, e, pricing)
    assert isinstance(c, Charge), c
    return c


def test_completed_on_demand_is_charged_in_full_at_the_on_demand_price():
    c = charge(start(), stop(hours=1.5))
    assert (c.charge_class, c.gpu_seconds, c.billable_gpu_seconds) == ("charged", 10800, 10800)
    assert c.rate == Decimal("3.00") and c.cost == Decimal("9.000000") and c.price_version == "2026-11"
    assert c.period == "2026-11"


def test_a_spot_node_pays_the_spot_price_and_premium_pays_more_on_demand():
    assert charge(start(spot=True), stop()).cost == Decimal("2.400000")
    assert charge(start(), stop(), Pricing(tier="premium")).cost == Decimal("7.500000")
    assert charge(start(spot=True), stop(), Pricing(tier="premium")).cost == Decimal("2.400000")


def test_the_price_version_is_the_one_in_effect_at_the_start_or_the_quoted_one():
    before = T0 - timedelta(days=10)
    c = charge(start(at=before), Stop("e", "completed", before + timedelta(hours=1)))
    assert (c.price_version, c.rate) == ("2026-01", Decimal("3.40"))
    quoted = charge(start(), stop(), Pricing(tier="standard", pinned_version="2026-01"))
    assert (quoted.price_version, quoted.rate) == ("2026-01", Decimal("3.40"))


def test_preempted_work_is_billed_at_spot_only_up_to_the_last_checkpoint():
    c = charge(start(spot=False), stop("preempted", hours=1, checkpoint_hours=0.75))
    assert c.gpu_seconds == 7200 and c.billable_gpu_seconds == 5400
    assert c.rate == Decimal("1.20") and c.cost == Decimal("1.800000") and c.charge_class == "charged"


def test_a_pause_is_the_tenants_own_stop_charged_in_full_at_the_capacitys_price():
    """Paused: every GPU-second the segment ran, once, at on-demand on an on-demand node (not the
    spot rate of a preemption the tenant did not choose, nor only up to an earlier checkpoint)."""
    paused = Stop("e-stop", "preempted", T0 + timedelta(hours=1), checkpointed_at=T0 + timedelta(minutes=20),
                  reason=PreemptionReason.PAUSE)
    c = charge(start(spot=False), paused)
    assert (c.charge_class, c.gpu_seconds, c.billable_gpu_seconds) == ("charged", 7200, 7200)
    assert c.rate == Decimal("3.00") and c.cost == Decimal("6.000000") and c.basis.startswith("paused by the tenant")
    assert charge(start(spot=True), paused).rate == Decimal("1.20")


@pytest.mark.parametrize("checkpoint_hours, billable", [(None, 0), (-2.0, 0), (3.0, 7200)])
def test_preemption_without_a_checkpoint_in_the_segment_bills_nothing(checkpoint_hours, billable):
    """No checkpoint, one from an earlier segment (before this start), or one after the stop (clamped)."""
    c = charge(start(), stop("preempted", hours=1, checkpoint_hours=checkpoint_hours))
    assert c.billable_gpu_seconds == billable


@pytest.mark.parametrize("error_class, klass, cost, held", [
    ("user", "charged", Decimal("6.000000"), Decimal("6.000000")),
    ("platform", "refunded", Decimal(0), Decimal("6.000000")),
    ("ambiguous", "review", Decimal(0), Decimal("6.000000")),
])
def test_failures_are_charged_refunded_or_held_by_their_class(error_class, klass, cost, held):
    c = charge(start(), stop("failed", error_class=error_class))
    assert (c.charge_class, c.cost, c.list_cost) == (klass, cost, held)
    assert c.billable_gpu_seconds == (7200 if klass == "charged" else 0)


def test_the_jobs_class_wins_when_it_is_kinder_to_the_tenant():
    preempted = stop("preempted", checkpoint_hours=0.5)
    assert charge(start(), preempted, Pricing("standard", job_class="refunded")).charge_class == "refunded"
    assert charge(start(), preempted, Pricing("standard", job_class="review")).charge_class == "review"
    platform = stop("failed", error_class="platform")
    assert charge(start(), platform, Pricing("standard", job_class="review")).charge_class == "refunded"


def test_a_review_decision_charges_or_refunds_what_was_held():
    ambiguous = stop("failed", error_class="ambiguous")
    charged = charge(start(), ambiguous, Pricing("standard", review_decision="charge"))
    assert (charged.charge_class, charged.cost) == ("charged", Decimal("6.000000"))
    refunded = charge(start(), ambiguous, Pricing("standard", review_decision="refund"))
    assert (refunded.charge_class, refunded.cost) == ("refunded", Decimal(0))
    user = charge(start(), stop("failed", error_class="user"), Pricing("standard", review_decision="refund"))
    assert user.charge_class == "charged"  # a decision only applies to what was held


@pytest.mark.parametrize("s, e, pricing, code", [
    (start(), stop(hours=-0.1), STANDARD, "stop_before_start"),
    (start(), stop(hours=24 * 40), STANDARD, "absurd_duration"),
    (start(count=0), stop(), STANDARD, "absurd_gpu_count"),
    (start(count=100_000), stop(), STANDARD, "absurd_gpu_count"),
    (start(gpu="TPUv9"), stop(), STANDARD, "unknown_gpu_type"),
    (start(), stop(), Pricing(tier=None), "unknown_tenant"),
    (start(), stop(), Pricing(tier="gold"), "unknown_tier"),
    (start(), stop(), Pricing(tier="standard", pinned_version="1999-01"), "unknown_price_version"),
    (start(at=datetime(2019, 1, 1, tzinfo=UTC)), Stop("e", "completed", datetime(2019, 1, 1, 1, tzinfo=UTC)),
     STANDARD, "no_price_version"),
])
def test_bad_input_is_an_anomaly_with_a_reason(s, e, pricing, code):
    result = bill_segment(s, e, pricing)
    assert isinstance(result, Anomaly) and result.code == code and result.message


def test_money_and_seconds_are_exact_decimals():
    s = start(count=3)
    e = Stop("e", "completed", T0 + timedelta(seconds=1, microseconds=1))
    c = charge(s, e)
    assert c.gpu_seconds == Decimal("3.000003")
    assert c.cost == Decimal("0.002500")  # 3.000003 GPU-s x 3.00/h = 0.0025000025 -> micro-USD, half up
    assert seconds_between(T0, T0 + timedelta(days=1, microseconds=7)) == Decimal("86400.000007")


def test_conflicting_ends_resolve_the_same_way_in_any_order():
    completed = Stop("b", "completed", T0 + timedelta(hours=2))
    lost = Stop("a", "preempted", T0 + timedelta(hours=3), reason="node_lost")
    tie = Stop("c", "failed", T0 + timedelta(hours=2), error_class="platform")
    assert pick_stop(pick_stop(None, completed), lost) == pick_stop(pick_stop(None, lost), completed) == completed
    assert pick_stop(completed, tie) == pick_stop(tie, completed) == completed
    early, late = start(event="x"), start(at=T0 + timedelta(minutes=1), event="y")
    assert pick_start(early, late) == pick_start(late, early) == late


def test_a_node_the_platform_lost_is_refunded_with_what_was_checkpointed_and_lost():
    s = start(spot=False)
    lost = Stop("x", "preempted", s.started_at + timedelta(seconds=256), reason="node_lost",
                checkpointed_at=s.started_at + timedelta(seconds=250))
    c = charge(s, lost)
    assert c.charge_class == "refunded" and c.cost == 0 and c.billable_gpu_seconds == 0
    assert c.list_cost > 0 and c.gpu_seconds == 256 * s.gpu_count
    assert f"{250 * s.gpu_count} of {256 * s.gpu_count} GPU-s checkpointed" in c.basis
    assert f"{6 * s.gpu_count} GPU-s lost" in c.basis and "refunded" in c.basis
    # capacity the tenant accepted (spot, priority) is not a refund
    spot = Stop("y", "preempted", s.started_at + timedelta(seconds=256), reason="spot_loss",
                checkpointed_at=s.started_at + timedelta(seconds=250))
    assert charge(s, spot).charge_class == "charged"
