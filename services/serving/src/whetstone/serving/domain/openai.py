"""OpenAI-compatible request bodies and response shapes (chat.completion, text_completion). Pure.

Every parameter OpenAI defines is either implemented or refused: `unsupported_parameter` names the
first request field (or message field) that asks for something this server does not do (logprobs,
tools, a JSON response format, penalties, ...), with its value left at OpenAI's default being fine;
a field OpenAI does not define is refused as unknown. Nothing is silently ignored."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from whetstone.contracts.base import JsonAtMost

ROLES = ("system", "user", "assistant")


class StreamOptions(BaseModel):
    include_usage: bool = False


# Every field bounded (OpenAI's limits where it states them: 4 stop sequences, 16 prompts); the
# token limits of the served model are checked after parsing.
MAX_TEXT_CHARS = 1 << 20            # one message's or prompt's text
MAX_MESSAGES = 2048
MAX_PARTS = 256                     # content parts of one message
MAX_IMAGE_URL_CHARS = 32 << 20      # a data: URL; the configured per-image size (ImageLimits) is checked later
MAX_FIELDS, MAX_FIELD_NAME = 64, 64
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
Stop = Annotated[str, Field(max_length=256)]


class _KeepsUnknownFields(BaseModel):
    """Unknown fields are kept, so that `unsupported_parameter` can name them, but bounded: at most
    64 fields in all, names of at most 64 characters, each unknown value at most 4 KiB of JSON."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"maxProperties": MAX_FIELDS,
                                                                 "propertyNames": {"maxLength": MAX_FIELD_NAME}})
    __pydantic_extra__: dict[str, Annotated[Any, JsonAtMost(4096)]] = Field(init=False)

    @model_validator(mode="before")
    @classmethod
    def _few_short_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if len(data) > MAX_FIELDS:
                raise ValueError(f"at most {MAX_FIELDS} fields")
            long = next((k for k in data if isinstance(k, str) and len(k) > MAX_FIELD_NAME), None)
            if long is not None:
                raise ValueError(f"field name {long[:MAX_FIELD_NAME]!r}... is over {MAX_FIELD_NAME} characters")
        return data


class _Request(_KeepsUnknownFields):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=8)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop | Annotated[list[Stop], Field(max_length=4)] | None = None
    seed: int | None = None
    user: str | None = Field(default=None, max_length=256)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("up to 4 non-empty stop sequences")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Text


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=MAX_IMAGE_URL_CHARS)
    detail: str = Field(default="auto", max_length=16)     # checked by the shared image rules (auto, low, high)


class ImageContentPart(BaseModel):
    """OpenAI's image part: `{"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail"?}}`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["image_url"]
    image_url: ImageUrl


Part = Annotated[ContentPart | ImageContentPart, Field(discriminator="type")]


@dataclass(frozen=True)
class RequestImage:
    """One image part of a chat request, where it is (`messages[i].content[j]`, as errors name it)."""

    message: int
    part: int
    role: str
    url: str
    detail: str

    @property
    def at(self) -> str:
        return f"messages[{self.message}].content[{self.part}]"


class ChatMessage(_KeepsUnknownFields):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | Annotated[list[Part], Field(max_length=MAX_PARTS)]

    def as_template_message(self, image_token: str = "") -> dict[str, str]:
        """The message as a chat template reads it: text, each image written as the model's image token."""
        if isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(p.text if isinstance(p, ContentPart) else image_token for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def images(self) -> list[RequestImage]:
        """The request's image parts, in order."""
        return [RequestImage(i, j, m.role, p.image_url.url, p.image_url.detail)
                for i, m in enumerate(self.messages) if not isinstance(m.content, str)
                for j, p in enumerate(m.content) if isinstance(p, ImageContentPart)]


class CompletionRequest(_Request):
    prompt: Text | Annotated[list[Text], Field(max_length=16)]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for /v1/completions

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not 1 <= len(v) <= 16:
            raise ValueError("1 to 16 prompts")
        return v

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def token_limit(self) -> int | None:
        return self.max_tokens


# -- what is refused ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Unsupported:
    param: str
    message: str
    code: str = "unsupported_parameter"


def _default(value: Any, defaults: tuple[Any, ...]) -> bool:
    return value in defaults or (isinstance(value, (list, dict)) and not value and None in defaults)


# OpenAI parameters this server does not implement, with the values that ask for nothing (accepted)
# and why a value beyond them is refused
_NOT_IMPLEMENTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "logprobs": ((None, False), "token log probabilities are not computed"),
    "top_logprobs": ((None, 0), "token log probabilities are not computed"),
    "tools": ((None,), "the served models answer with text only, no tool calls"),
    "tool_choice": ((None, "none"), "the served models answer with text only, no tool calls"),
    "parallel_tool_calls": ((None,), "the served models answer with text only, no tool calls"),
    "functions": ((None,), "the served models answer with text only, no function calls"),
    "function_call": ((None, "none"), "the served models answer with text only, no function calls"),
    "response_format": ((None,), "answers are plain text; only {\"type\": \"text\"} is accepted"),
    "frequency_penalty": ((None, 0), "no frequency penalty is applied; only 0 is accepted"),
    "presence_penalty": ((None, 0), "no presence penalty is applied; only 0 is accepted"),
    "logit_bias": ((None,), "no logit bias is applied"),
    "store": ((None, False), "completions are not stored; only false is accepted"),
    "audio": ((None,), "answers are text only"),
    "modalities": ((None,), "answers are text only; only [\"text\"] is accepted"),
    "prediction": ((None,), "predicted outputs are not used"),
    "web_search_options": ((None,), "there is no web search"),
    "reasoning_effort": ((None,), "the served models have no reasoning effort setting"),
    "verbosity": ((None,), "the served models have no verbosity setting"),
    "service_tier": ((None, "auto", "default"), "there is one service tier (auto)"),
    "echo": ((None, False), "the prompt is not echoed; only false is accepted"),
    "best_of": ((None, 1), "use n for several answers"),
    "suffix": ((None,), "text insertion with a suffix is not done"),
}
# accepted without effect on the answer: bookkeeping only, documented as such
_BOOKKEEPING = frozenset({"metadata", "safety_identifier", "prompt_cache_key"})
_MESSAGE_NOT_IMPLEMENTED = {
    "tool_calls": "the served models answer with text only, no tool calls",
    "function_call": "the served models answer with text only, no function calls",
    "name": "the models' chat templates do not render participant names",
    "audio": "messages are text only",
}


def unsupported(req: _Request) -> Unsupported | None:
    """The first parameter of `req` that this server would otherwise have to ignore, or None."""
    extra = dict(req.model_extra or {})
    for name, value in extra.items():
        if name in _BOOKKEEPING:
            continue
        rule = _NOT_IMPLEMENTED.get(name)
        if rule is None:
            return Unsupported(name, f"Unrecognized request argument supplied: {name}.", "unknown_parameter")
        defaults, why = rule
        if name == "response_format" and isinstance(value, dict) and value.get("type") == "text":
            continue
        if name == "modalities" and value == ["text"]:
            continue
        if name == "logprobs" and isinstance(req, CompletionRequest) and value is None:
            continue
        if not _default(value, defaults):
            return Unsupported(name, f"`{name}` is not supported by this server: {why}.")
    if isinstance(req, ChatCompletionRequest):
        for i, m in enumerate(req.messages):
            for name, value in (m.model_extra or {}).items():
                if value is None or (isinstance(value, (list, dict)) and not value):
                    continue        # what the client echoes back of an earlier answer (refusal: null, ...)
                refusal = _MESSAGE_NOT_IMPLEMENTED.get(name)
                param = f"messages[{i}].{name}"
                if refusal is None:
                    return Unsupported(param, f"Unrecognized message field supplied: {param}.", "unknown_parameter")
                return Unsupported(param, f"`{param}` is not supported by this server: {refusal}.")
    return None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_completion(cid: str, model: str, choices: list[tuple[str, str]], prompt_tokens: int,
                    completion_tokens: int, created: int | None = None) -> dict[str, Any]:
    """`choices`: (text, finish_reason) in index order."""
    return {"id": cid, "object": "chat.completion", "created": created or int(time.time()), "model": model,
            "system_fingerprint": None,
            "choices": [{"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": finish} for i, (text, finish) in enumerate(choices)],
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_chunk(cid: str, model: str, created: int, index: int | None, delta: dict[str, Any] | None = None,
               finish_reason: str | None = None, usage_: dict[str, int] | None = None) -> dict[str, Any]:
    choices = [] if index is None else [{"index": index, "delta": delta or {}, "logprobs": None,
                                          "finish_reason": finish_reason}]
    chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": None, "choices": choices}
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def text_completion(cid: str, model: str, choices: list[tuple[str, str]], prompt_tokens: int,
                    completion_tokens: int, created: int | None = None) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created or int(time.time()), "model": model,
            "system_fingerprint": None,
            "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": finish}
                        for i, (text, finish) in enumerate(choices)],
            "usage": usage(prompt_tokens, completion_tokens)}


def text_chunk(cid: str, model: str, created: int, index: int | None, text: str = "",
               finish_reason: str | None = None, usage_: dict[str, int] | None = None) -> dict[str, Any]:
    choices = [] if index is None else [{"index": index, "text": text, "logprobs": None,
                                          "finish_reason": finish_reason}]
    chunk = {"id": cid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": None, "choices": choices}
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk
