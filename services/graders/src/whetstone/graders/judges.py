"""Calls to operator-configured OpenAI-compatible endpoints: the judge of score_model / label_model
graders (`POST {base_url}/chat/completions`) and the embeddings of cosine similarity
(`POST {base_url}/embeddings`). An error names the status or the exception class, never the key."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, TypeAdapter

from .settings import Endpoint

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class JudgeServerError(RuntimeError):
    """The endpoint did not answer usably (unreachable, timeout, non-2xx, malformed body)."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.total_tokens += other.total_tokens

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass
class JudgeAnswer:
    content: str | None
    refusal: str | None
    usage: Usage = field(default_factory=Usage)


def headers(endpoint: Endpoint) -> dict[str, str]:
    key = endpoint.api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


async def post(client: httpx.AsyncClient, endpoint: Endpoint, path: str, body: dict[str, Any]) -> dict[str, Any]:
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
    return data


async def chat(client: httpx.AsyncClient, endpoint: Endpoint, model: str, messages: list[dict[str, Any]],
               response_format: dict[str, Any], sampling: dict[str, Any]) -> JudgeAnswer:
    body = {"model": endpoint.model or model, "messages": messages, "response_format": response_format,
            "max_tokens": sampling.pop("max_completions_tokens", None) or endpoint.max_tokens, **sampling}
    data = await post(client, endpoint, "/chat/completions", body)
    try:
        message = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise JudgeServerError("the endpoint's answer has no choices[0].message") from exc
    raw = data.get("usage") or {}
    usage = Usage(int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0),
                  int(raw.get("total_tokens") or 0))
    return JudgeAnswer(message.get("content"), message.get("refusal"), usage)


async def embed(client: httpx.AsyncClient, endpoint: Endpoint, texts: list[str]) -> list[list[float]]:
    data = await post(client, endpoint, "/embeddings", {"model": endpoint.model, "input": texts})
    try:
        rows = sorted(data["data"], key=lambda row: row["index"])
        vectors = [[float(x) for x in row["embedding"]] for row in rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise JudgeServerError("the embeddings answer has no data[].embedding") from exc
    if len(vectors) != len(texts):
        raise JudgeServerError(f"the embeddings answer has {len(vectors)} vectors for {len(texts)} texts")
    return vectors


def score_format(low: float, high: float) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "score", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["result"],
        "properties": {"result": {"type": "number", "minimum": low, "maximum": high}}}}}


def label_format(labels: list[str]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "label", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["result"],
        "properties": {"result": {"type": "string", "enum": labels}}}}}


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
