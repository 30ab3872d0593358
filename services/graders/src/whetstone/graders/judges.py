"""Calls to operator-configured OpenAI-compatible endpoints: the judge of score_model / label_model
graders (`POST {base_url}/chat/completions`) and the embeddings of cosine similarity
(`POST {base_url}/embeddings`). An error names the status or the exception class, never the key."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import httpx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
)

from .models import SamplingParams
from .settings import Endpoint

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class JudgeServerError(RuntimeError):
    """The endpoint did not answer usably (unreachable, timeout, non-2xx, malformed body)."""


class Usage(BaseModel):
    """Tokens a judge spent (OpenAI's `usage`; a server that sends none spent 0 as far as we know)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.total_tokens += other.total_tokens


class ImageUrl(BaseModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ChatPart(BaseModel):
    """A content part of a chat-completions message: text, or an image by URL."""

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageUrl | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[ChatPart]


class _AnswerMessage(BaseModel):
    content: str | None = None
    refusal: str | None = None


class _Choice(BaseModel):
    message: _AnswerMessage


class _Usage(BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class _ChatCompletion(BaseModel):
    """The fields of a chat completion a judge's answer is read from."""

    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage | None = None


class _Embedding(BaseModel):
    index: int
    embedding: list[float]


class _Embeddings(BaseModel):
    data: list[_Embedding]


class JudgeAnswer(BaseModel):
    content: str | None
    refusal: str | None
    usage: Usage = Field(default_factory=Usage)


def headers(endpoint: Endpoint) -> dict[str, str]:
    key = endpoint.api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


async def post(client: httpx.AsyncClient, endpoint: Endpoint, path: str, body: dict[str, Any]) -> bytes:
    """The endpoint's 2xx answer body."""
    url = endpoint.base_url.rstrip("/") + path
    try:
        resp = await client.post(url, json=body, headers=headers(endpoint), timeout=endpoint.timeout_s)
    except httpx.HTTPError as exc:
        raise JudgeServerError(f"the endpoint did not answer ({type(exc).__name__})") from exc
    if resp.status_code >= 400:
        raise JudgeServerError(f"the endpoint answered HTTP {resp.status_code}")
    try:
        data = resp.json()
    except ValueError as exc:
        raise JudgeServerError("the endpoint's answer is not JSON") from exc
    if not isinstance(data, dict):
        raise JudgeServerError("the endpoint's answer is not a JSON object")
    return resp.content


async def chat(client: httpx.AsyncClient, endpoint: Endpoint, model: str, messages: list[ChatMessage],
               response_format: dict[str, JsonValue], sampling: SamplingParams | None) -> JudgeAnswer:
    """One chat completion of the judge. `sampling`: the grader's parameters (reasoning_effort is not a
    chat-completions parameter of open servers: left out; max_completions_tokens is sent as max_tokens)."""
    given = sampling.model_dump(exclude_none=True, exclude={"reasoning_effort", "max_completions_tokens"}) \
        if sampling else {}
    limit = sampling.max_completions_tokens if sampling else None
    body = {"model": endpoint.model or model, "messages": [m.model_dump(exclude_none=True) for m in messages],
            "response_format": response_format, "max_tokens": limit or endpoint.max_tokens, **given}
    try:
        data = _ChatCompletion.model_validate_json(await post(client, endpoint, "/chat/completions", body))
    except ValidationError as exc:
        raise JudgeServerError("the endpoint's answer has no choices[0].message") from exc
    message, raw = data.choices[0].message, data.usage or _Usage()
    usage = Usage(prompt_tokens=raw.prompt_tokens or 0, completion_tokens=raw.completion_tokens or 0,
                  total_tokens=raw.total_tokens or 0)
    return JudgeAnswer(content=message.content, refusal=message.refusal, usage=usage)


async def embed(client: httpx.AsyncClient, endpoint: Endpoint, texts: list[str]) -> list[list[float]]:
    body = await post(client, endpoint, "/embeddings", {"model": endpoint.model, "input": texts})
    try:
        rows = sorted(_Embeddings.model_validate_json(body).data, key=lambda row: row.index)
    except ValidationError as exc:
        raise JudgeServerError("the embeddings answer has no data[].embedding") from exc
    vectors = [row.embedding for row in rows]
    if len(vectors) != len(texts):
        raise JudgeServerError(f"the embeddings answer has {len(vectors)} vectors for {len(texts)} texts")
    return vectors


def score_format(low: float, high: float) -> dict[str, JsonValue]:
    return {"type": "json_schema", "json_schema": {"name": "score", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["result"],
        "properties": {"result": {"type": "number", "minimum": low, "maximum": high}}}}}


def label_format(labels: list[str]) -> dict[str, JsonValue]:
    enum: list[JsonValue] = list(labels)
    return {"type": "json_schema", "json_schema": {"name": "label", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["result"],
        "properties": {"result": {"type": "string", "enum": enum}}}}}


class ScoreVerdict(BaseModel):
    """The judge's answer in `score_format`."""
    model_config = ConfigDict(strict=True)
    result: float


class LabelVerdict(BaseModel):
    """The judge's answer in `label_format`."""
    model_config = ConfigDict(strict=True)
    result: str


SCORE = TypeAdapter(ScoreVerdict | float, config=ConfigDict(strict=True))
LABEL = TypeAdapter(LabelVerdict | str, config=ConfigDict(strict=True))


def parse_score(content: str) -> float | None:
    """`{"result": x}` as asked; a bare number or the first number in the text from a judge that
    ignores response_format."""
    try:
        value = SCORE.validate_python(json.loads(content))
        return value.result if isinstance(value, ScoreVerdict) else value
    except ValueError:
        pass
    match = NUMBER.search(content)
    return float(match.group(0)) if match else None


def parse_label(content: str, labels: list[str]) -> str | None:
    try:
        value = LABEL.validate_python(json.loads(content))
        label = value.result if isinstance(value, LabelVerdict) else value
        if label in labels:
            return label
    except ValueError:
        pass
    text = content.strip().strip('"').strip()
    return text if text in labels else None
