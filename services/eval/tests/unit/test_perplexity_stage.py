"""Continued pre-training's holdout: perplexity over the held-out documents, read with errors naming the line."""

import math

import pytest

from whetstone.eval.adapters.holdout import HoldoutError, read_text_holdout
from whetstone.eval.domain.policy import HoldoutPolicy
from whetstone.eval.domain.stages import decide_perplexity

pytestmark = pytest.mark.unit


def test_perplexity_must_drop_by_the_policy_margin():
    policy = HoldoutPolicy(min_relative_improvement=0.05)
    passed = decide_perplexity(math.log(100), math.log(90), 8, 400, policy)
    assert passed.status == "passed" and "90.000 vs base 100.000 on 8 documents (400 tokens)" in passed.reason
    assert {m.name for m in passed.metrics} == {"holdout_loss", "holdout_perplexity"}
    flat = decide_perplexity(math.log(100), math.log(97), 8, 400, policy)
    assert flat.status == "failed" and "needs <= 95.000 (5% lower)" in flat.reason
    assert decide_perplexity(1.0, float("nan"), 8, 400, policy).status == "failed"


def test_text_holdout_rows_are_read_with_errors_naming_the_line(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "one"}\n\n{"text": "two"}\n{"text": "three"}\n')
    assert read_text_holdout(good, 2) == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "one"}\n{"messages": []}\n')
    with pytest.raises(HoldoutError, match="line 2: .*'text' string; got \\['messages'\\]"):
        read_text_holdout(bad, 10)
