"""Reading the holdout (validation) file and the harmful-prompt set, with errors naming the line."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from whetstone.modelkit.image_reader import check_image_url
from whetstone.modelkit.image_rules import ImageLimits, ImageProblem

from ..domain.rows import HarmfulPrompt, HoldoutRow, ImageRef, Turn

T = TypeVar("T")
SHIPPED_SAFETY = Path(__file__).resolve().parents[1] / "suites" / "safety" / "harmful_prompts.jsonl"


class HoldoutError(ValueError):
    """The validation file cannot be used; the message names the line and field."""


class _Turn(BaseModel):
    model_config = ConfigDict(strict=True)
    role: str
    content: str | list[Any]


class _ImageUrl(BaseModel):
    model_config = ConfigDict(strict=True)
    url: str
    detail: str = "auto"


class _Part(BaseModel):
    """One content part of a message with images: `{"type": "text", "text"}` or
    `{"type": "image_url", "image_url": {"url", "detail"?}}`."""

    model_config = ConfigDict(strict=True)
    type: str
    text: str | None = None
    image_url: _ImageUrl | None = None


def _parts(turn: _Turn, content: list[Any], at: str) -> tuple[str | ImageRef, ...]:
    """A content list's parts in order; every image checked as ingest checks it (format, size, pixels)."""
    if turn.role == "assistant":
        raise HoldoutError(f"{at}: images are only allowed in user messages, not in the assistant's answer")
    parts: list[str | ImageRef] = []
    for j, raw in enumerate(content):
        where = f"{at}.content[{j}]"
        try:
            part = _Part.model_validate(raw)
        except ValidationError:
            raise HoldoutError(f"{where}: expected a text part or an image_url part with a string url") from None
        if part.type == "text" and part.text is not None:
            parts.append(part.text)
        elif part.type == "image_url" and part.image_url is not None:
            checked = check_image_url(part.image_url.url, ImageLimits(), where)
            if isinstance(checked, ImageProblem):
                raise HoldoutError(checked.message)
            parts.append(ImageRef(part.image_url.url, part.image_url.detail))
        elif part.type in ("text", "image_url"):
            raise HoldoutError(f"{where}: the {part.type} part needs its '{part.type}' field")
        else:
            raise HoldoutError(f"{where}: part type {part.type!r} is not supported (text or image_url)")
    return tuple(parts)


class _ChatRow(BaseModel):
    """A chat row (`messages`) or ingest's preference row (`prompt` + `chosen`: the chosen answer is the
    reference); other keys are ignored."""

    messages: Any = None
    prompt: Any = None
    chosen: Any = None


class _HarmfulRow(BaseModel):
    prompt: str
    category: str = "uncategorized"


def _turns(value: Any, name: str, line_no: int, min_len: int = 1) -> list[Turn]:
    if not isinstance(value, list) or len(value) < min_len:
        raise HoldoutError(f"validation file line {line_no}: '{name}' must be a list of at least {min_len} turn(s)")
    turns = []
    for i, m in enumerate(value):
        try:
            turn = _Turn.model_validate(m)
        except ValidationError:
            raise HoldoutError(f"validation file line {line_no}: {name}[{i}] needs string 'role' and 'content' "
                               "(a string or a list of content parts)") from None
        if isinstance(turn.content, str):
            turns.append(Turn(turn.role, turn.content))
            continue
        parts = _parts(turn, turn.content, f"validation file line {line_no}: {name}[{i}]")
        text = "".join(p for p in parts if isinstance(p, str))
        turns.append(Turn(turn.role, text, parts) if any(isinstance(p, ImageRef) for p in parts)
                     else Turn(turn.role, text))
    return turns


def _row(obj: Any, line_no: int) -> HoldoutRow:
    if not isinstance(obj, dict):
        raise HoldoutError(f"validation file line {line_no}: expected a JSON object")
    row = _ChatRow.model_validate(obj)
    if row.messages is not None:
        messages = _turns(row.messages, "messages", line_no, min_len=2)
    elif row.prompt is not None and row.chosen is not None:
        messages = _turns(row.prompt, "prompt", line_no) + _turns(row.chosen, "chosen", line_no)
    else:
        raise HoldoutError(f"validation file line {line_no}: expected 'messages' (chat) or 'prompt' + 'chosen' "
                           f"(preference); got keys {sorted(obj)[:6]}")
    if messages[-1].role != "assistant":
        raise HoldoutError(f"validation file line {line_no}: the last message must be the assistant's answer")
    return HoldoutRow(messages[:-1], messages[-1].content, messages)


def read_rows(path: Path, limit: int, row: Callable[[Any, int], T]) -> list[T]:
    """The first `limit` non-blank lines of a JSONL validation file, each read by `row(obj, line_no)`."""
    rows: list[T] = []
    with open(path, encoding="utf-8", errors="strict") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HoldoutError(f"validation file line {line_no}: not JSON ({exc.msg})") from exc
            rows.append(row(obj, line_no))
            if len(rows) >= limit:
                break
    return rows


def read_holdout(path: Path, limit: int) -> list[HoldoutRow]:
    return read_rows(path, limit, _row)


def _text_row(obj: Any, line_no: int) -> str:
    text = obj.get("text") if isinstance(obj, dict) else None
    if not isinstance(text, str) or not text.strip():
        keys = sorted(obj)[:6] if isinstance(obj, dict) else type(obj).__name__
        raise HoldoutError(f"validation file line {line_no}: a continued pre-training holdout row needs a non-empty "
                           f"'text' string; got {keys}")
    return text


def read_text_holdout(path: Path, limit: int) -> list[str]:
    """The documents of a continued pre-training validation file (`{"text": ...}` per line)."""
    return read_rows(path, limit, _text_row)


def _csv_prompt(row: dict[str, str]) -> HarmfulPrompt | None:
    """AdvBench (`goal`), HarmBench (`Behavior`, `SemanticCategory`) or our own (`prompt`, `category`) columns."""
    prompt = row.get("prompt") or row.get("goal") or row.get("Behavior")
    if not prompt:
        return None
    return HarmfulPrompt(prompt, row.get("category") or row.get("SemanticCategory") or "uncategorized")


def read_harmful_prompts(path: Path | None) -> list[HarmfulPrompt]:
    """The shipped JSONL, or an operator's AdvBench/HarmBench CSV or JSONL."""
    path = Path(path) if path else SHIPPED_SAFETY
    if not path.is_file():
        raise FileNotFoundError(f"harmful prompt set {path} does not exist")
    if path.suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            return [p for p in map(_csv_prompt, csv.DictReader(f)) if p is not None]
    with open(path, encoding="utf-8") as f:
        rows = [_HarmfulRow.model_validate_json(line) for line in f if line.strip()]
    return [HarmfulPrompt(r.prompt, r.category) for r in rows]
