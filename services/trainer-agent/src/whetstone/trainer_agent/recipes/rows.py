"""Training rows as typed models: each JSON line is parsed once into a `ChatRow`, `PreferenceRow` or
`TextRow`, and a bad one is a UserError naming the file, the line and the field (`parse_row`).

The models type what the platform reads (roles, weights, tool calls, content parts). Each also keeps
the JSON object it was parsed from: the chat template and trl receive the documents as the user wrote
them, keys the models do not name (`description`, `parameters`, a call's `id`...) and key order
included (`ChatMessage.template`, `ChatRow.template_tools`, `PreferenceRow.record`).
"""

from __future__ import annotations

import json
from typing import Literal, TypedDict, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .errors import UserError

Role = Literal["system", "user", "assistant", "tool"]
SUPPORTED_ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")
PREFERENCE_KEYS = ("prompt", "chosen", "rejected")


def _bad(message: str) -> PydanticCustomError:
    """A check of this module: its message names the field itself (see `_where`)."""
    return PydanticCustomError("bad_row", message)


Document = dict[str, JsonValue]   # a JSON object handed to the chat template or trl


class _Document(BaseModel):
    """A parsed JSON object that remembers its source (`_source`)."""

    model_config = ConfigDict(frozen=True)
    _source: Document = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_source(cls, value: object, handler: ValidatorFunctionWrapHandler) -> _Document:
        parsed: _Document = handler(value)
        if isinstance(value, dict):
            parsed._source = dict(value)
        return parsed

    def template(self) -> Document:
        """The object as written (a shallow copy)."""
        return dict(self._source)


class ToolFunction(_Document):
    """A call's `function`: `arguments` a JSON object, or the JSON string of one (kept as written)."""

    name: str = Field(min_length=1)
    arguments: str | dict[str, JsonValue] = Field(default_factory=dict)


class ToolCall(_Document):
    """OpenAI's `{"id"?, "type": "function", "function": {"name", "arguments"}}`."""

    function: ToolFunction

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, value: object) -> object:
        function = value.get("function") if isinstance(value, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad("needs a function with a 'name'")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise _bad("arguments are not valid JSON") from None
        if not isinstance(arguments, dict):
            raise _bad("arguments must be a JSON object")
        return value


class ImageUrl(_Document):
    url: str | None = None


class ContentPart(_Document):
    """One part of a message's content list (vision rows: `text` and `image_url` parts)."""

    type: str | None = None
    text: str | None = None
    image_url: ImageUrl | None = None


class ChatMessage(_Document):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    weight: int | None = None
    tool_calls: list[ToolCall] | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, value: object) -> object:
        if value not in SUPPORTED_ROLES:
            raise _bad(f"has role {value!r}; expected one of {SUPPORTED_ROLES}")
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: object) -> object:
        parts = isinstance(value, list) and value and all(isinstance(p, dict) for p in value)
        if value is not None and not isinstance(value, str) and not parts:
            raise _bad("has no string 'content' (nor a list of content parts)")
        return value

    @field_validator("name", "tool_call_id", mode="before")
    @classmethod
    def _string(cls, value: object, info: ValidationInfo) -> object:
        if value is not None and not isinstance(value, str):
            raise _bad(f"has a non-string {info.field_name!r}")
        return value

    @field_validator("weight", mode="before")
    @classmethod
    def _weight(cls, value: object) -> object:
        if value is not None and (isinstance(value, bool) or value not in (0, 1)):
            raise _bad(f"has weight {value!r}; expected 0 or 1")
        return value

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _calls(cls, value: object) -> object:
        if value is not None and (not isinstance(value, list) or not value):
            raise _bad("has 'tool_calls' that is not a non-empty list")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise _bad(f"has 'tool_calls' but role {self.role!r} (only assistant turns call tools)")
        if self.content is None and not self.tool_calls:
            raise _bad("has no string 'content' (nor a list of content parts)")
        return self

    @property
    def trained(self) -> bool:
        """Whether its tokens are trained: its weight, else assistant turns only."""
        return bool(self.weight) if self.weight is not None else self.role == "assistant"


class ToolSpec(_Document):
    name: str


class ToolDefinition(_Document):
    """A row-level tool: OpenAI's `{"type": "function", "function": {"name", ...}}` or the bare function."""

    function: ToolSpec | None = None
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _named(cls, value: object) -> object:
        function = value.get("function", value) if isinstance(value, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad("has no function 'name'")
        return value


class ChatRow(_Document):
    """One SFT row: its messages and the tool definitions the template renders (None: no tools)."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, value: object) -> object:
        if not isinstance(value, dict) or not isinstance(value.get("messages"), list) or not value["messages"]:
            raise _bad("expected an object with a non-empty 'messages' list")
        if value.get("tools") is not None and not isinstance(value["tools"], list):
            raise _bad("'tools' must be a list of tool definitions")
        return value

    @model_validator(mode="after")
    def _trains(self) -> ChatRow:
        if not any(m.trained for m in self.messages):
            raise _bad("no trained message (needs an assistant message with weight 1)")
        return self

    def template_messages(self) -> list[Document]:
        return [m.template() for m in self.messages]

    def template_tools(self) -> list[Document] | None:
        """The tool definitions as written (None when the row has none)."""
        return [t.template() for t in self.tools] if self.tools else None


class PreferenceRecord(TypedDict):
    """A preference pair as trl's DPO/ORPO trainers read it."""

    prompt: list[Document]
    chosen: list[Document]
    rejected: list[Document]


class PreferenceRow(_Document):
    """A preference pair; a string side is one message (the prompt a user turn, the answers assistant turns)."""

    prompt: list[ChatMessage] = Field(min_length=1)
    chosen: list[ChatMessage] = Field(min_length=1)
    rejected: list[ChatMessage] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _sides(cls, value: object) -> object:
        if not isinstance(value, dict) or not all(k in value for k in PREFERENCE_KEYS):
            raise _bad("expected 'prompt', 'chosen' and 'rejected'")
        out = dict(value)
        for key, role in zip(PREFERENCE_KEYS, ("user", "assistant", "assistant"), strict=True):
            side = value[key]
            if isinstance(side, str):
                if not side.strip():
                    raise _bad(f"'{key}' is empty")
                out[key] = [{"role": role, "content": side}]
            elif not isinstance(side, list) or not side:
                raise _bad(f"'{key}' must be a string or a non-empty list of messages")
        return out

    @model_validator(mode="after")
    def _pair(self) -> PreferenceRow:
        for key, side in (("chosen", self.chosen), ("rejected", self.rejected)):
            if side[-1].role != "assistant":
                raise _bad(f"'{key}' must end with an assistant message")
        if self.chosen == self.rejected:
            raise _bad("'chosen' and 'rejected' are identical")
        return self

    def record(self) -> PreferenceRecord:
        return PreferenceRecord(prompt=[m.template() for m in self.prompt],
                                chosen=[m.template() for m in self.chosen],
                                rejected=[m.template() for m in self.rejected])


class TextRow(_Document):
    """A continued pre-training document."""

    text: str

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, value: object) -> object:
        if not isinstance(value, dict) or not isinstance(value.get("text"), str) or not value["text"].strip():
            raise _bad("expected an object with a non-empty 'text' string")
        return value


Row = TypeVar("Row", ChatRow, PreferenceRow, TextRow)


def parse_row(model: type[Row], row: object, name: str, line_no: int) -> Row:
    """The line's row as `model`; UserError naming the file, line and field of the first problem."""
    try:
        return model.model_validate(row)
    except ValidationError as exc:
        raise UserError(f"{name} line {line_no}{_where(exc)}", code="bad_example") from exc


def _where(exc: ValidationError) -> str:
    """': message 1: tool_calls[0] needs a function with a 'name'' from the first error's location."""
    error = exc.errors()[0]
    loc = list(error["loc"])
    own = error["type"] == "bad_row"
    if own and loc and isinstance(loc[-1], str) and loc[-1] in ChatMessage.model_fields:
        loc = loc[:-1]   # a field check: its message names the field
    pieces: list[str] = []
    for i, key in enumerate(loc):
        nxt = loc[i + 1] if i + 1 < len(loc) else None
        if isinstance(key, int):
            continue
        if isinstance(nxt, int):
            label = "message" if key == "messages" or key in PREFERENCE_KEYS else None
            prefix = f"'{key}' " if key in PREFERENCE_KEYS else ""
            pieces.append(f"{prefix}{label} {nxt}" if label else f"{key}[{nxt}]")
        else:
            pieces.append(f"'{key}'" if key in PREFERENCE_KEYS else key)
    subject = ": ".join(pieces)
    message = error["msg"]
    if not own:
        return f": {subject}: {message}" if subject else f": {message}"
    return f": {subject} {message}" if subject else f": {message}"
