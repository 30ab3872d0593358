"""The rows the gate scores, read once from the validation file and the harmful-prompt set. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import JsonValue


class Side(StrEnum):
    """Which model answers: the base, the base with the candidate adapter, or with the last accepted one."""

    BASE = "base"
    CANDIDATE = "candidate"
    LAST = "last"


@dataclass(frozen=True)
class ImageRef:
    """One image of a held-out chat: OpenAI's `image_url` part (a `data:` URL, checked when read)."""

    url: str
    detail: str = "auto"


@dataclass(frozen=True)
class Turn:
    """One chat message, as a chat template reads it. A message with images keeps its content parts in
    order (`parts`: text as str, images as ImageRef); `content` is then its text alone."""

    role: str
    content: str
    parts: tuple[str | ImageRef, ...] = ()

    @property
    def images(self) -> tuple[ImageRef, ...]:
        return tuple(p for p in self.parts if isinstance(p, ImageRef))


Conversation = Sequence[Turn]


@dataclass(frozen=True)
class HoldoutRow:
    prompt: list[Turn]          # the conversation up to the answer
    reference: str              # the expected final assistant answer
    messages: list[Turn]        # the whole conversation (for the loss)

    @property
    def has_images(self) -> bool:
        return any(t.parts for t in self.messages)


@dataclass(frozen=True)
class HarmfulPrompt:
    prompt: str
    category: str = "uncategorized"


@dataclass(frozen=True)
class RftRow:
    """A reinforcement job's held-out row."""

    prompt: list[Turn]                 # the conversation the model answers (ends with the user's turn)
    item: dict[str, JsonValue]         # the whole row, as the grader's `item` sees it

    @property
    def question(self) -> str:
        return self.prompt[-1].content
