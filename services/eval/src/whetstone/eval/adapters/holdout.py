"""Reading the holdout (validation) file and the harmful-prompt set, with errors naming the line."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

SHIPPED_SAFETY = Path(__file__).resolve().parents[1] / "suites" / "safety" / "harmful_prompts.jsonl"


class HoldoutError(ValueError):
    """The validation file cannot be used; the message names the line and field."""


@dataclass(frozen=True)
class HoldoutRow:
    prompt: list[dict]          # the conversation up to the answer
    reference: str              # the expected final assistant answer
    messages: list[dict]        # the whole conversation (for the loss)


def _row(obj, line_no: int) -> HoldoutRow:
    if not isinstance(obj, dict):
        raise HoldoutError(f"validation file line {line_no}: expected a JSON object")
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or len(messages) < 2:
            raise HoldoutError(f"validation file line {line_no}: 'messages' must be a list of at least 2 turns")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise HoldoutError(f"validation file line {line_no}: messages[{i}] needs string 'role' and 'content'")
        if messages[-1]["role"] != "assistant":
            raise HoldoutError(f"validation file line {line_no}: the last message must be the assistant's answer")
        clean = [{"role": m["role"], "content": m["content"]} for m in messages]
        return HoldoutRow(clean[:-1], clean[-1]["content"], clean)
    if "input" in obj and "preferred_output" in obj:  # preference data: the preferred answer is the reference
        prompt = (obj.get("input") or {}).get("messages")
        preferred = obj.get("preferred_output")
        if not isinstance(prompt, list) or not prompt or not isinstance(preferred, list) or not preferred:
            raise HoldoutError(f"validation file line {line_no}: 'input.messages' and 'preferred_output' must be "
                               "non-empty lists")
        answer = preferred[0].get("content") if isinstance(preferred[0], dict) else None
        if not isinstance(answer, str):
            raise HoldoutError(f"validation file line {line_no}: preferred_output[0].content must be a string")
        clean = [{"role": m.get("role"), "content": m.get("content")} for m in prompt]
        return HoldoutRow(clean, answer, [*clean, {"role": "assistant", "content": answer}])
    raise HoldoutError(f"validation file line {line_no}: expected 'messages' (chat) or 'input' + 'preferred_output' "
                       f"(preference); got keys {sorted(obj)[:6]}")


def read_holdout(path: Path, limit: int) -> list[HoldoutRow]:
    rows = []
    with open(path, encoding="utf-8", errors="strict") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HoldoutError(f"validation file line {line_no}: not JSON ({exc.msg})") from exc
            rows.append(_row(obj, line_no))
            if len(rows) >= limit:
                break
    return rows


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
