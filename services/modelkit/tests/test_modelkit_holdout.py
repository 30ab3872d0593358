import math

import pytest

from whetstone.modelkit.chat import IGNORE_INDEX, tokenize_chat
from whetstone.modelkit.holdout import holdout_loss

pytestmark = pytest.mark.unit

ROWS = [
    [{"role": "user", "content": f"What is {a} + {b}?"}, {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2)]
] + [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"},
      {"role": "assistant", "content": "Hello! How can I help you today?"}]]


def test_holdout_loss_is_finite_deterministic_and_counts_trained_tokens(tiny_model_dir, tokenizer):
    from whetstone.modelkit.loading import load_model

    model = load_model(tiny_model_dir, dtype="float32")
    model.train()
    first = holdout_loss(model, tokenizer, ROWS, max_len=128, batch_size=4)
    second = holdout_loss(model, tokenizer, ROWS, max_len=128, batch_size=2)

    expected_tokens = sum(
        sum(label != IGNORE_INDEX for label in tokenize_chat(tokenizer, row, 128)["labels"][1:]) for row in ROWS
    )
    assert first["tokens"] == expected_tokens
    assert math.isfinite(first["loss"]) and first["loss"] > 0
    assert first["perplexity"] == pytest.approx(math.exp(first["loss"]))
    assert second["loss"] == pytest.approx(first["loss"], rel=1e-5)  # batching/padding does not matter
    assert model.training  # the caller's train/eval mode is restored


def test_holdout_without_trained_tokens_raises(tiny_model_dir, tokenizer):
    from whetstone.modelkit.loading import load_model

    model = load_model(tiny_model_dir, dtype="float32")
    with pytest.raises(ValueError, match="no trained tokens"):
        holdout_loss(model, tokenizer, [[{"role": "user", "content": "hi"}]])
