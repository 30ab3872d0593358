"""Chat rendering with a platform-computed assistant mask.

Real base models' chat templates rarely carry trl's `{% generation %}` markers, so the
platform works out which tokens to train on by itself:

1. Render the conversation with the tokenizer's OWN chat template (no template patching).
2. For every message, find its character span in the rendered text by rendering the
   conversation prefixes incrementally (`messages[:i]`, `messages[:i+1]` and, for an
   assistant turn, `messages[:i]` + generation prompt) and diffing their lengths.
   If the template is not prefix-stable (e.g. it rewrites earlier turns), fall back to
   locating each message's content in order.
3. Tokenize the full text once with offsets; a token is trained iff its first character
   falls inside a trained span.

A trained span is the message content plus the template's end-of-turn marker that
follows it (e.g. `<|end|>`, `<|eot_id|>`, `<|im_end|>`), trailing whitespace excluded:
exactly what trl's `{% generation %}` blocks cover, so the model learns to stop.
The role header (`<|assistant|>\\n`) is never trained.

Per-message `weight`: 0 = not trained, 1 = trained. Default: assistant 1, others 0 (so
`tool` results and user turns are never trained unless weighted 1).

Tools (OpenAI's shape): pass the definitions as `tools=[...]` (forwarded to the template);
assistant messages may carry `tool_calls` (content empty or null), whose JSON-string
`arguments` are handed to the template as dicts, as Hugging Face templates expect. An
assistant turn with tool calls is trained on everything the template renders for it
(the call included), from the generation prompt to its end-of-turn marker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

IGNORE_INDEX = -100
_TEMPLATE_KEYS_DROPPED = ("weight",)


class ChatFormatError(ValueError):
    """The conversation is malformed (bad role/content/weight) or cannot be masked."""


def message_weight(message: Mapping[str, Any]) -> int:
    """1 if the message is trained, else 0 (explicit `weight` wins over the role default)."""
    weight = message.get("weight")
    if weight is None:
        return 1 if message.get("role") == "assistant" else 0
    if isinstance(weight, bool) or weight not in (0, 1):
        raise ChatFormatError(f"message weight must be 0 or 1, got {weight!r}")
    return int(weight)


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call as chat templates read it: `arguments` a dict (OpenAI writes a JSON string)."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            raise ChatFormatError(f"tool call arguments are not valid JSON: {arguments[:80]!r}") from exc
        if isinstance(parsed, dict):
            function["arguments"] = parsed
    return {**call, "type": call.get("type", "function"), "function": function}


def _template_message(m: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if k not in _TEMPLATE_KEYS_DROPPED}
    if m.get("tool_calls"):
        out["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        if out.get("content") is None:
            out["content"] = ""
    return out


def _template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatFormatError(f"message {i} is not an object")
        if not isinstance(message.get("role"), str):
            raise ChatFormatError(f"message {i} has no string 'role'")
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            raise ChatFormatError(f"message {i} has no string 'content'")
    return [_template_message(m) for m in messages]


def _render(tokenizer, messages, *, add_generation_prompt: bool = False, **template_kwargs) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )


def _span_end(text: str, start: int, end: int, content_end: int) -> int:
    """End of a trained span: drop trailing whitespace the template adds after the turn."""
    stripped = len(text[:end].rstrip())
    return max(min(stripped, end), min(content_end, end), start)


def _spans_by_prefix_diff(tokenizer, messages, text, weights, **template_kwargs) -> list[tuple[int, int]] | None:
    spans: list[tuple[int, int]] = []
    seg_start = 0
    for i, message in enumerate(messages):
        rendered = _render(tokenizer, messages[: i + 1], **template_kwargs)
        if not text.startswith(rendered) or len(rendered) < seg_start:
            return None  # template is not prefix-stable
        seg_end = len(rendered)
        if weights[i]:
            content = message["content"]
            content_start = None
            if message["role"] == "assistant" and i > 0:
                prompt = _render(tokenizer, messages[:i], add_generation_prompt=True, **template_kwargs)
                if text.startswith(prompt) and seg_start <= len(prompt) <= seg_end:
                    content_start = len(prompt)
            if content_start is None:
                # rfind: the content follows the role header, which may contain the same text
                found = text.rfind(content, seg_start, seg_end) if content else -1
                if found < 0:
                    return None
                content_start = found
            content_end = content_start + len(content) if text.startswith(content, content_start) else content_start
            spans.append((content_start, _span_end(text, content_start, seg_end, content_end)))
        seg_start = seg_end
    return spans


def _spans_by_content_search(tokenizer, messages, text, weights) -> list[tuple[int, int]]:
    end_markers = sorted(
        (t for t in getattr(tokenizer, "all_special_tokens", []) if t), key=len, reverse=True
    )
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, message in enumerate(messages):
        content = message["content"]
        found = text.find(content, cursor) if content else -1
        if found < 0:
            if weights[i]:
                raise ChatFormatError(
                    f"cannot locate message {i} ({message['role']}) in the rendered chat template output"
                )
            continue
        end = found + len(content)
        cursor = end
        if weights[i]:
            marker = next((m for m in end_markers if text.startswith(m, end)), None)
            spans.append((found, end + len(marker) if marker else end))
    return spans


def render_with_spans(
    tokenizer, messages: Sequence[Mapping[str, Any]], **template_kwargs
) -> tuple[str, list[tuple[int, int]]]:
    """Rendered text and the [start, end) character spans that are trained."""
    if not messages:
        raise ChatFormatError("conversation has no messages")
    clean = _template_messages(messages)
    weights = [message_weight(m) for m in messages]
    text = _render(tokenizer, clean, **template_kwargs)
    spans = _spans_by_prefix_diff(tokenizer, clean, text, weights, **template_kwargs)
    if spans is None:
        spans = _spans_by_content_search(tokenizer, clean, text, weights)
    return text, spans


def _encode(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    # The template already emits BOS etc.: never let the tokenizer add them again.
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _trained_flags(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    flags = []
    for start, end in offsets:
        flags.append(end > start and any(s <= start < e for s, e in spans))
    return flags


def tokenize_chat(
    tokenizer, messages: Sequence[Mapping[str, Any]], max_len: int | None = None, **template_kwargs
) -> dict[str, list[int]]:
    """Token ids + labels (-100 on untrained tokens) for one conversation.

    Returns `{"input_ids", "attention_mask", "labels"}`, truncated to `max_len` (keep start).
    """
    text, spans = render_with_spans(tokenizer, messages, **template_kwargs)
    input_ids, offsets = _encode(tokenizer, text)
    flags = _trained_flags(offsets, spans)
    labels = [tok if trained else IGNORE_INDEX for tok, trained in zip(input_ids, flags)]
    if max_len is not None:
        input_ids, labels = input_ids[:max_len], labels[:max_len]
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def mask_preview(tokenizer, messages: Sequence[Mapping[str, Any]], **template_kwargs) -> str:
    """The rendered conversation with every trained token run wrapped in `[[ ]]`."""
    text, spans = render_with_spans(tokenizer, messages, **template_kwargs)
    _, offsets = _encode(tokenizer, text)
    flags = _trained_flags(offsets, spans)
    starts = [start for start, _ in offsets]
    pieces: list[str] = [text[: starts[0]] if starts else text]
    inside = False
    for k, start in enumerate(starts):
        piece_end = starts[k + 1] if k + 1 < len(starts) else len(text)
        if flags[k] and not inside:
            pieces.append("[[")
            inside = True
        elif not flags[k] and inside:
            pieces.append("]]")
            inside = False
        piece = text[start:piece_end]
        if inside and k + 1 < len(starts) and not flags[k + 1]:
            # close the bracket before whitespace that belongs to the untrained tail
            body = text[start : offsets[k][1]]
            pieces.append(body + "]]" + piece[len(body) :])
            inside = False
            continue
        pieces.append(piece)
    if inside:
        pieces.append("]]")
    return "".join(pieces)
