"""Padding-free attention for packed rows, on any device.

transformers already keeps packed examples apart when it sees `position_ids` that restart
at 0 and no attention mask: it builds a block-diagonal causal mask. That is correct but
costs (sum of lengths)^2 per row. `varlen_sdpa` registers an attention implementation that
instead runs scaled-dot-product attention once per example (causal), so a packed row costs
sum(length^2), like flash-attention's varlen kernels on GPU. Anything that is not a
packed single row (padded batches, generation) goes to the stock sdpa path.
"""

from __future__ import annotations

NAME = "whetstone_varlen_sdpa"


def segment_bounds(position_ids) -> list[int] | None:
    """Start offsets of the examples of a packed row (+ its length), or None if not packed."""
    row = position_ids[0]
    if int(row[0]) != 0:
        return None
    starts = (row == 0).nonzero().flatten().tolist()
    return [*starts, int(row.shape[0])]


class _LastBounds:
    """The bounds of the last `position_ids` tensor seen: every layer of one forward gets the same
    tensor, so the row is scanned (and the host waits for the device) once per forward, not per layer."""

    def __init__(self) -> None:
        self.position_ids = None
        self.bounds: list[int] | None = None

    def of(self, position_ids) -> list[int] | None:
        if position_ids is not self.position_ids:
            self.position_ids, self.bounds = position_ids, segment_bounds(position_ids)
        return self.bounds


_last = _LastBounds()


def varlen_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    bounds = None
    if attention_mask is None and position_ids is not None and query.shape[0] == 1 \
            and query.shape[2] == key.shape[2] and kwargs.get("past_key_values") is None:
        bounds = _last.of(position_ids)
    if bounds is None or len(bounds) <= 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    return _per_example(module, query, key, value, bounds, dropout, scaling)


def _per_example(module, query, key, value, bounds: list[int], dropout: float, scaling) -> tuple:
    """Causal sdpa on each example's part of the row, straight through torch: the grouped key/value
    heads repeated and the output laid out (batch, seq, heads, head_dim) once per row. The parts come
    from one `split` per tensor, whose backward joins the examples' gradients in one copy (a slice per
    example would backpropagate as a zero-filled full-row tensor per example)."""
    from itertools import pairwise

    import torch

    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    lengths = [end - start for start, end in pairwise(bounds)]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outputs = [sdpa(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True)
               for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2),
                                  value.split(lengths, dim=2))]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None  # (batch, seq, heads, head_dim)


def register() -> str:
    """Make `attn_implementation=NAME` available to from_pretrained; idempotent."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_sdpa)
    return NAME
