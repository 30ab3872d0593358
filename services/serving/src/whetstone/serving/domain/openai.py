"""OpenAI-compatible request bodies and response shapes (chat.completion, text_completion). Pure."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ROLES = ("system", "user", "assistant")


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown OpenAI parameters are accepted and ignored

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=8)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
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
        return bool((self.stream_options or {}).get("include_usage"))


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]

    def as_template_message(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    prompt: str | list[str]
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
