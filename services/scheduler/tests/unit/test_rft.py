"""Reinforcement jobs' estimate (scheduler/usecases/rft.py) and view (entrypoints/views.py)."""

import pytest

from whetstone.contracts import ReinforcementSpec
from whetstone.scheduler.entrypoints.views import reinforcement_view
from whetstone.scheduler.usecases.rft import epoch_tokens

pytestmark = pytest.mark.unit

SPEC = {"grader": {"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "x",
                   "operation": "eq"}, "n_epochs": 2, "batch_size": 4, "learning_rate": 2e-5, "generations": 8,
        "eval_interval": 10, "eval_samples": 1, "reasoning_effort": "high", "max_completion_tokens": 512,
        "response_format": None}
RL = ReinforcementSpec(**SPEC)


def test_epoch_tokens_count_every_generation_up_to_the_budget():
    # 20 prompts of 2,000 tokens in all, 8 samples each of up to 512 tokens
    assert epoch_tokens(2000, 20, RL) == 8 * (2000 + 20 * 512)
    assert epoch_tokens(2000, 20, RL.model_copy(update={"max_completion_tokens": 128})) < epoch_tokens(2000, 20, RL)
    assert epoch_tokens(None, 20, RL) is None      # unknown stays unknown
    assert epoch_tokens(2000, 20, None) == 2000    # not a reinforcement job


def test_the_view_shows_openai_fields():
    view = reinforcement_view(RL).model_dump(mode="json")
    assert view["grader"]["name"] == "s"
    assert view["hyperparameters"] == {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 2.0,
                                       "compute_multiplier": 2.0, "eval_interval": 10, "eval_samples": 1,
                                       "reasoning_effort": "high"}
    assert "response_format" not in view
