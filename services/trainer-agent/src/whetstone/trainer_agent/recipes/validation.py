"""Validation components: model -> {"validation_loss", "validation_tokens"?,
"validation_mean_token_accuracy"?}, run at each
checkpoint (by the training monitor) and once at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Validator = Callable[[Any], dict[str, Any]]


def examples_validator(examples: list[dict[str, Any]], *, pad_id: int, batch_size: int) -> Validator:
    """Loss on the trained tokens (labels) of held-out, already tokenized examples: chat
    conversations masked as for training (tools included), or cpt documents (every token)."""
    from whetstone.modelkit.holdout import examples_loss

    def validate(model) -> dict[str, Any]:
        metrics = examples_loss(model, examples, pad_id=pad_id, batch_size=batch_size)
        return {"validation_loss": metrics["loss"], "validation_tokens": metrics["tokens"],
                "validation_mean_token_accuracy": metrics["accuracy"]}

    return validate


def preference_loss(trainer, model) -> dict[str, float]:
    """DPO/ORPO loss on the trainer's validation pairs, without logging (trainer.evaluate would log
    and flip the model to eval mode under the step's own log)."""
    was_training = model.training
    try:
        output = trainer.evaluation_loop(trainer.get_eval_dataloader(), "validation", prediction_loss_only=True)
    finally:
        model.train(was_training)
        getattr(trainer, "_metrics", {}).get("eval", {}).clear()
    return {"validation_loss": output.metrics["eval_loss"]}
