"""Holdout loss over trained (assistant) tokens only."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

from whetstone.modelkit.chat import IGNORE_INDEX, tokenize_chat


def holdout_loss(
    model,
    tokenizer,
    rows: Sequence[Sequence[Mapping[str, Any]]],
    max_len: int = 512,
    batch_size: int = 8,
) -> dict[str, float | int]:
    """Token-weighted mean next-token loss on the trained tokens of `rows` (lists of messages).

    Returns `{"loss", "perplexity", "tokens"}`; `tokens` counts the scored (trained) tokens.
    Deterministic: eval mode, no dropout, no grad, fixed order.
    """
    examples = [tokenize_chat(tokenizer, messages, max_len) for messages in rows]
    examples = [ex for ex in examples if any(label != IGNORE_INDEX for label in ex["labels"][1:])]
    if not examples:
        raise ValueError("no trained tokens in the holdout rows")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return examples_loss(model, examples, pad_id=pad_id, batch_size=batch_size)


@dataclass(frozen=True)
class LossSums:
    """Summed next-token loss over the labelled tokens, how many there were, and how many the model's
    argmax predicted."""

    loss: float
    tokens: int
    correct: int


def labelled_loss_sums(model, batches: Iterable[dict[str, Tensor]]) -> LossSums:
    """`LossSums` over batches of model inputs with `labels` (-100 where not trained): eval mode, no
    grad, the model's training mode restored after. Each batch's other tensors are the model's keyword
    arguments."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_loss, total_tokens, total_correct = 0.0, 0, 0
    try:
        with torch.no_grad():
            for batch in batches:
                labels = batch.pop("labels")
                logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
                shift_logits = logits[:, :-1, :].float()
                shift_labels = labels[:, 1:].to(device)
                total_loss += F.cross_entropy(
                    shift_logits.reshape(-1, shift_logits.size(-1)),
                    shift_labels.reshape(-1),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                ).item()
                trained = shift_labels != IGNORE_INDEX
                total_tokens += int(trained.sum().item())
                total_correct += int(((shift_logits.argmax(-1) == shift_labels) & trained).sum().item())
    finally:
        model.train(was_training)
    return LossSums(loss=total_loss, tokens=total_tokens, correct=total_correct)


def _padded_batches(examples: Sequence[Mapping[str, Sequence[int]]], pad_id: int, batch_size: int
                    ) -> Iterator[dict[str, Tensor]]:
    import torch

    for i in range(0, len(examples), batch_size):
        batch = examples[i : i + batch_size]
        width = max(len(ex["input_ids"]) for ex in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        for row, ex in enumerate(batch):
            n = len(ex["input_ids"])
            input_ids[row, :n] = torch.tensor(ex["input_ids"])
            attention[row, :n] = 1
            labels[row, :n] = torch.tensor(ex["labels"])
        yield {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def examples_loss(
    model,
    examples: Sequence[Mapping[str, Sequence[int]]],
    pad_id: int = 0,
    batch_size: int = 8,
) -> dict[str, float | int]:
    """Token-weighted mean next-token loss over the labelled tokens of pre-tokenized examples
    (`{"input_ids", "labels"}`, labels -100 where not trained), in right-padded batches; `accuracy` is
    the share of those tokens the model's argmax predicts."""
    sums = labelled_loss_sums(model, _padded_batches(examples, pad_id, batch_size))
    loss = sums.loss / sums.tokens
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "tokens": sums.tokens,
            "accuracy": sums.correct / sums.tokens}
