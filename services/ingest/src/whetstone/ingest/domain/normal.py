"""A validated row in the platform's form: what a layout normalises a raw row to, and what the
train file holds, one JSON line each. Pure.

Three shapes (see `schemas.py` for which input layouts map to which):

- `ChatRow`: `{"messages", "tools"?}`; a reinforcement row also keeps its item (`{"messages", the
  item's keys}`, the keys as written);
- `PreferenceRow`: `{"prompt", "chosen", "rejected", "tools"?}`, three message lists;
- `TextRow`: `{"text"}`.

The messages themselves stay JSON objects in OpenAI's shape (`chat.py` validated them): they are
written back as they are and handed to the tokenizer's chat template as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from .jsontypes import JsonObject

Messages: TypeAlias = list[JsonObject]


@dataclass(frozen=True, slots=True)
class ChatRow:
    messages: Messages
    tools: list[Any] | None = None          # OpenAI's tool definitions, when the row declares any
    item: JsonObject | None = None          # a reinforcement row as written: its other keys are the item

    def as_json(self) -> JsonObject:
        if self.item is not None:
            return {**self.item, "messages": self.messages}
        return {"messages": self.messages, "tools": self.tools} if self.tools else {"messages": self.messages}

    def all_messages(self) -> Messages:
        return self.messages

    def map_messages(self, fn: Callable[[Messages], Messages]) -> ChatRow:
        return ChatRow(fn(self.messages), self.tools, self.item)


@dataclass(frozen=True, slots=True)
class PreferenceRow:
    prompt: Messages
    chosen: Messages
    rejected: Messages
    tools: list[Any] | None = None

    def as_json(self) -> JsonObject:
        out: JsonObject = {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected}
        if self.tools:
            out["tools"] = self.tools
        return out

    def all_messages(self) -> Messages:
        return [*self.prompt, *self.chosen, *self.rejected]

    def map_messages(self, fn: Callable[[Messages], Messages]) -> PreferenceRow:
        return PreferenceRow(fn(self.prompt), fn(self.chosen), fn(self.rejected), self.tools)


@dataclass(frozen=True, slots=True)
class TextRow:
    text: str
    tools: None = None

    def as_json(self) -> JsonObject:
        return {"text": self.text}


NormalRow: TypeAlias = ChatRow | PreferenceRow | TextRow


class NotNormalRow(ValueError):
    pass


def written_row(value: JsonObject) -> NormalRow:
    """A line of a file the gate wrote (or a row in the platform's form) read back as its type."""
    tools = value.get("tools") or None
    if "messages" in value:
        return ChatRow(value["messages"], tools)
    if "chosen" in value:
        return PreferenceRow(value["prompt"], value["chosen"], value["rejected"], tools)
    if "text" in value:
        return TextRow(value["text"])
    raise NotNormalRow(f"not a row in the platform's form (keys: {', '.join(sorted(value))[:200]})")
