"""The output schemas, purposes, and what the checks read of a normalised row. Pure.

| schema            | written as                                              | purposes   |
|-------------------|---------------------------------------------------------|------------|
| chat              | {"messages", "tools"?}                                  | sft, eval  |
| prompt_completion | {"messages"} (user -> assistant)                        | sft, eval  |
| instruction       | {"messages"} (system? history? user -> assistant)       | sft, eval  |
| preference        | {"prompt", "chosen", "rejected", "tools"?} message lists | dpo        |
| text              | {"text"}                                                | cpt, eval  |
| rft               | {"messages" (ending with user), the item's keys}        | rft        |

Which input layouts (OpenAI chat, ShareGPT, Alpaca, TRL preference, OpenAI DPO, ...) map
to which schema is in `layouts.py`.
"""

from __future__ import annotations

from typing import Any

from enum import StrEnum

from whetstone.contracts import Purpose

from .chat import message_text
from .jsontypes import JsonObject
from .normal import NormalRow, PreferenceRow, TextRow, written_row


class Schema(StrEnum):
    CHAT = "chat"
    PROMPT_COMPLETION = "prompt_completion"
    INSTRUCTION = "instruction"
    PREFERENCE = "preference"
    TEXT = "text"
    RFT = "rft"


PURPOSES = tuple(p.value for p in Purpose)
PURPOSE_SCHEMAS: dict[str, tuple[Schema, ...]] = {
    Purpose.SFT: (Schema.CHAT, Schema.PROMPT_COMPLETION, Schema.INSTRUCTION),
    Purpose.DPO: (Schema.PREFERENCE,),
    Purpose.CPT: (Schema.TEXT,),
    Purpose.EVAL: (Schema.CHAT, Schema.PROMPT_COMPLETION, Schema.INSTRUCTION, Schema.TEXT),
    Purpose.RFT: (Schema.RFT,),
}
OUTPUT_SCHEMA: dict[str, Schema] = {
    Schema.CHAT: Schema.CHAT, Schema.PROMPT_COMPLETION: Schema.CHAT, Schema.INSTRUCTION: Schema.CHAT,
    Schema.PREFERENCE: Schema.PREFERENCE, Schema.TEXT: Schema.TEXT, Schema.RFT: Schema.RFT}
DEFAULT_PURPOSE: dict[str, Purpose] = {Schema.PREFERENCE: Purpose.DPO, Schema.TEXT: Purpose.CPT,
                                       Schema.RFT: Purpose.RFT}


def default_purpose(schema: str) -> Purpose:
    return DEFAULT_PURPOSE.get(schema, Purpose.SFT)


def _as_messages(value: str | list[Any], role: str) -> list[JsonObject]:
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def normalize_preference(prompt: str | list[Any] | None, chosen: str | list[Any],
                         rejected: str | list[Any]) -> PreferenceRow:
    """Explicit conversational form: prompt, chosen and rejected as message lists.

    Without a prompt, the two conversations' longest common prefix is the prompt (TRL's
    implicit prompt). With one, sides that repeat it (UltraFeedback writes whole
    conversations beside `prompt`) are cut after it."""
    chosen, rejected = _as_messages(chosen, "assistant"), _as_messages(rejected, "assistant")
    if prompt is not None:
        head = _as_messages(prompt, "user")
        n = len(head)
        if chosen[:n] == head and rejected[:n] == head and len(chosen) > n and len(rejected) > n:
            chosen, rejected = chosen[n:], rejected[n:]
        return PreferenceRow(head, chosen, rejected)
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    return PreferenceRow(chosen[:shared], chosen[shared:], rejected[shared:])


def row_messages(out: NormalRow) -> list[JsonObject]:
    """Every message of a normalized row, in order (a text row is one message)."""
    if isinstance(out, TextRow):
        return [{"role": "text", "content": out.text}]
    return out.all_messages()


def text_messages(out: NormalRow) -> list[JsonObject]:
    """`row_messages` with each message's tool calls folded into its content and its images as `<image>`
    marks (what dedup reads)."""
    messages = row_messages(out)
    if any("tool_calls" in m or type(m["content"]) is list for m in messages):
        return [{"role": m["role"], "content": message_text(m)} for m in messages]
    return messages


def canonical_text(line: JsonObject) -> str:
    """The text the duplicate, contamination and toxicity checks look at, of a row as written."""
    return "\n".join(m["content"] for m in text_messages(written_row(line)))
