import math

import pytest

from whetstone.eval.domain.gate import GatePolicy, decide

pytestmark = pytest.mark.unit


def test_adapter_better_than_base_passes_with_the_numbers_in_the_reason():
    verdict, reasons = decide(8.25, 6.37, None)
    assert verdict == "passed"
    assert "6.3700 vs base 8.2500" in reasons[0] and "-22.8%" in reasons[0]


def test_adapter_worse_than_base_fails():
    verdict, reasons = decide(2.0, 2.5, None)
    assert verdict == "failed" and "needs to be below 2.0000" in reasons[0]


def test_minimum_improvement_is_enforced():
    assert decide(2.0, 1.95, None, GatePolicy(min_improvement=0.05))[0] == "failed"
    assert decide(2.0, 1.80, None, GatePolicy(min_improvement=0.05))[0] == "passed"


def test_regression_against_the_last_accepted_model_blocks_promotion():
    verdict, reasons = decide(3.0, 1.6, last_accepted_loss=1.4)
    assert verdict == "failed" and "regresses against the last accepted model" in reasons[1]
    assert decide(3.0, 1.45, last_accepted_loss=1.4)[0] == "passed"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_loss_fails(bad):
    verdict, reasons = decide(2.0, bad, None)
    assert verdict == "failed" and "not finite" in reasons[0]
