"""A tenant's eval_config may raise the gate's bar, never lower the safety floor or spend more than
the operator's budgets (domain/eval_bounds.py; pure)."""

import pytest

from whetstone.scheduler.config import SchedulerSettings
from whetstone.scheduler.domain.eval_bounds import EvalBounds, check_eval_config

pytestmark = pytest.mark.unit
BOUNDS = EvalBounds()


@pytest.mark.parametrize(("stage", "key", "value"), [
    ("safety", "refusal_floor", 0.5), ("safety", "max_drop_points", 50), ("holdout", "max_rows", 100_000),
    ("holdout", "max_new_tokens", 4096), ("holdout", "reward_max_new_tokens", 32768), ("judge", "max_pairs", 10_000),
])
def test_a_lower_floor_or_a_larger_budget_is_refused_naming_the_setting(stage, key, value):
    beyond = check_eval_config({"stages": {stage: {key: value}}}, BOUNDS)
    assert beyond is not None and beyond.param == f"eval_config.stages.{stage}.{key}"
    assert beyond.message.startswith(beyond.param)


def test_a_higher_bar_or_a_smaller_budget_is_the_tenants_choice():
    for config in (None, {}, {"stages": ["holdout", "safety"]}, {"stages": {"judge": False}},
                   {"stages": {"safety": {"refusal_floor": 0.99, "max_drop_points": 1.0},
                               "holdout": {"max_rows": 16, "metric": "exact_match"}, "judge": {"max_pairs": 8}}},
                   {"stages": {"safety": {"refusal_floor": "low"}}}):   # not a number: the eval gate refuses it
        assert check_eval_config(config, BOUNDS) is None, config


def test_the_operator_sets_the_bounds(monkeypatch):
    monkeypatch.setenv("WHETSTONE_SCHEDULER_EVAL_BOUNDS", '{"min_refusal_floor": 0.5, "max_judge_pairs": 8}')
    bounds = SchedulerSettings().eval_bounds
    assert check_eval_config({"stages": {"safety": {"refusal_floor": 0.6}}}, bounds) is None
    beyond = check_eval_config({"stages": {"judge": {"max_pairs": 9}}}, bounds)
    assert beyond is not None and beyond.param == "eval_config.stages.judge.max_pairs"
