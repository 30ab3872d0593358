"""Reading the holdout (validation) file and the harmful-prompt set, with errors naming the line."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
SHIPPED_SAFETY = Path(__file__).resolve().parents[1] / "suites" / "safety" / "harmful_prompts.jsonl"


class HoldoutError(ValueError):
    """The validation file cannot be used; the message names the line and field."""


@dataclass(frozen=True)
class HoldoutRow:
    prompt: list[dict]          # the conversation up to the answer
    reference: str              # the expected final assistant answer
    messages: list[dict]        # the whole conversation (for the loss)


def _messages(value, name: str, line_no: int, min_len: int = 1) -> list[dict]:
    if not isinstance(value, list) or len(value) < min_len:
        raise HoldoutError(f"validation file line {line_no}: '{name}' must be a list of at least {min_len} turn(s)")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise HoldoutError(f"validation file line {line_no}: {name}[{i}] needs string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _row(obj, line_no: int) -> HoldoutRow:
    if not isinstance(obj, dict):
        raise HoldoutError(f"validation file line {line_no}: expected a JSON object")
    if "messages" in obj:
        messages = _messages(obj["messages"], "messages", line_no, min_len=2)
    elif "prompt" in obj and "chosen" in obj:  # ingest's preference schema: the chosen answer is the reference
        messages = _messages(obj["prompt"], "prompt", line_no) + _messages(obj["chosen"], "chosen", line_no)
    else:
        raise HoldoutError(f"validation file line {line_no}: expected 'messages' (chat) or 'prompt' + 'chosen' "
                           f"(preference); got keys {sorted(obj)[:6]}")
    if messages[-1]["role"] != "assistant":
        raise HoldoutError(f"validation file line {line_no}: the last message must be the assistant's answer")
    return HoldoutRow(messages[:-1], messages[-1]["content"], messages)


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


def read_harmful_prompts(path: Path | None) -> list[dict]:
    """[{category, prompt}] from the shipped JSONL, or an operator's AdvBench/HarmBench CSV or JSONL."""
    path = Path(path) if path else SHIPPED_SAFETY
    if not path.is_file():
        raise FileNotFoundError(f"harmful prompt set {path} does not exist")
    out = []
    if path.suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f):
                prompt = row.get("prompt") or row.get("goal") or row.get("Behavior")
                if prompt:
                    out.append({"prompt": prompt, "category": row.get("category") or row.get("SemanticCategory")
                                or "uncategorized"})
    else:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    out.append({"prompt": obj["prompt"], "category": obj.get("category", "uncategorized")})
    return out
