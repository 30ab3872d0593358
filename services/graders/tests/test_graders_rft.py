"""The reinforcement method object (OpenAI's fields, knobs resolved) and the RFT data gate. Pure."""

from __future__ import annotations

import pytest

from whetstone.graders import GraderInvalid
from whetstone.graders.rft import check_rows, generation_tokens, parse_method

pytestmark = pytest.mark.unit

GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
          "reference": "{{item.answer.value}}", "operation": "eq"}


def test_auto_and_numbers_resolve():
    plan = parse_method({"grader": GRADER})
    assert (plan.n_epochs, plan.batch_size, plan.generations, plan.max_completion_tokens) == (1, 8, 4, 256)
    plan = parse_method({"grader": GRADER, "hyperparameters": {
        "n_epochs": 3, "batch_size": "auto", "learning_rate_multiplier": 2, "compute_multiplier": 2.0,
        "eval_interval": 5, "eval_samples": 2, "reasoning_effort": "high"},
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}})
    assert plan.n_epochs == 3 and plan.batch_size == 8 and plan.learning_rate == pytest.approx(2e-5)
    assert plan.generations == 8 and plan.eval_interval == 5 and plan.eval_samples == 2
    assert plan.max_completion_tokens == 512 and plan.response_format["type"] == "json_schema"
    assert plan.record()["grader"]["name"] == "exact"
    fast = parse_method({"grader": GRADER, "hyperparameters": {"learning_rate_multiplier": 10_000}})
    assert fast.learning_rate == pytest.approx(0.1)   # a tiny model's step (bench/rft.py); any rate <= 1 is allowed
    assert generation_tokens(prompt_tokens=1000, rows=10, plan=plan) == 3 * (1000 * 8 + 10 * 8 * 512)


def test_max_completion_tokens_sets_the_budget_in_place_of_reasoning_effort():
    given = parse_method({"grader": GRADER, "hyperparameters": {"reasoning_effort": "high", "max_completion_tokens": 8}})
    assert (given.reasoning_effort, given.max_completion_tokens) == ("high", 8)
    assert given.record()["max_completion_tokens"] == 8
    auto = parse_method({"grader": GRADER, "hyperparameters": {"reasoning_effort": "low", "max_completion_tokens": "auto"}})
    assert auto.max_completion_tokens == 128
    for bad in (0, 4097, 2.5, True, "many"):
        with pytest.raises(GraderInvalid) as refused:
            parse_method({"grader": GRADER, "hyperparameters": {"max_completion_tokens": bad}})
        assert refused.value.param.startswith("method.reinforcement.hyperparameters.max_completion_tokens")


@pytest.mark.parametrize("data, param", [
    ({"grader": GRADER, "hyperparameters": {"n_epochs": -1}}, "method.reinforcement.hyperparameters.n_epochs"),
    ({"grader": GRADER, "hyperparameters": {"n_epochs": 1.5}}, "method.reinforcement.hyperparameters.n_epochs"),
    ({"grader": GRADER, "hyperparameters": {"compute_multiplier": 0}},
     "method.reinforcement.hyperparameters.compute_multiplier"),
    ({"grader": GRADER, "hyperparameters": {"compute_multiplier": 11}},
     "method.reinforcement.hyperparameters.compute_multiplier"),
    ({"grader": GRADER, "hyperparameters": {"learning_rate_multiplier": 0}},
     "method.reinforcement.hyperparameters.learning_rate_multiplier"),
    ({"grader": GRADER, "hyperparameters": {"learning_rate_multiplier": 100_001}},   # a learning rate over 1
     "method.reinforcement.hyperparameters.learning_rate_multiplier"),
    ({"grader": GRADER, "hyperparameters": {"reasoning_effort": "extreme"}},
     "method.reinforcement.hyperparameters.reasoning_effort"),
    ({"grader": GRADER, "hyperparameters": {"beta": 0.1}}, "method.reinforcement.hyperparameters.beta"),
    ({"grader": GRADER, "temperature": 1}, "method.reinforcement.temperature"),
    ({"grader": {**GRADER, "operation": "regex"}}, "method.reinforcement.grader.operation"),
    ({"grader": GRADER, "response_format": {"type": "text"}}, "method.reinforcement.response_format.type"),
    ({}, "method.reinforcement.grader"),
])
def test_refusals_name_the_field(data, param):
    with pytest.raises(GraderInvalid) as caught:
        parse_method(data)
    assert caught.value.param == param, caught.value


def test_the_data_gate_names_lines():
    plan = parse_method({"grader": GRADER})
    rows = [
        (1, {"messages": [{"role": "user", "content": "2+2?"}], "answer": {"value": "4"}}),
        (2, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
             "answer": {"value": "x"}}),
        (3, {"messages": [{"role": "user", "content": "3+3?"}], "answer": {}}),
        (4, ["not", "an", "object"]),
        (5, {"answer": {"value": "1"}}),
    ]
    problems, total = check_rows(rows, plan.grader)
    assert total == 4
    assert [(p.line, p.code) for p in problems] == [(2, "last_message_not_user"), (3, "missing_item_field"),
                                                    (4, "not_an_object"), (5, "missing_messages")]
    assert "{{item.answer.value}}" in str(problems[1]) and str(problems[1]).startswith("line 3:")
    assert check_rows(rows[:1], plan.grader) == ([], 0)


def test_reward_gate_needs_a_margin_over_the_base():
    from whetstone.graders.rft import reward_gate

    assert reward_gate(0.30, 0.60).verdict == "passed"
    failed = reward_gate(0.30, 0.32, margin=0.05)
    assert failed.verdict == "failed" and "quarantined" in failed.reason
    assert reward_gate(0.30, 0.10).verdict == "failed"
