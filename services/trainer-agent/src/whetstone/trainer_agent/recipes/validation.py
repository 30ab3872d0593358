"""Validation components: model -> `Validation` (loss, and where measured tokens and token
accuracy), run at each checkpoint (by the training monitor) and once at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..domain.recipe_io import Validation
from .data import ExampleRow

Validator = Callable[[Any], Validation]


def examples_validator(examples: list[ExampleRow], *, pad_id: int, batch_size: int) -> Validator:
    """Loss on the trained tokens (labels) of held-out, already tokenized examples: chat
    conversations masked as for training (tools included), or cpt documents (every token)."""
    from whetstone.modelkit.holdout import examples_loss

    def validate(model: Any) -> Validation:
        metrics = examples_loss(model, examples, pad_id=pad_id, batch_size=batch_size)
        return Validation(loss=metrics["loss"], tokens=metrics["tokens"], mean_token_accuracy=metrics["accuracy"])

    return validate


def preference_loss(trainer: Any, model: Any) -> Validation:
    """DPO/ORPO loss on the trainer's validation pairs, without logging (trainer.evaluate would log
    and flip the model to eval mode under the step's own log)."""
    was_training = model.training
    try:
        output = trainer.evaluation_loop(trainer.get_eval_dataloader(), "validation", prediction_loss_only=True)
    finally:
        model.train(was_training)
        getattr(trainer, "_metrics", {}).get("eval", {}).clear()
    return Validation(loss=output.metrics["eval_loss"])
