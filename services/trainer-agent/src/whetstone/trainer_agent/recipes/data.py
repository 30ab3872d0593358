"""Training data: reading (line-numbered), the method/format check, tokenization, collators.

Formats (JSON lines):
- chat SFT (lora, qlora, full): {"messages": [{"role", "content", "weight"?, "name"?}, ...], "tools"?: [...]}
  (`content` a string or, for images, a list of OpenAI content parts: trained by vision.py's recipe)
  in OpenAI's tool-calling shape too (as ingest normalises it): `tool` role messages
  (`tool_call_id`?), assistant turns with `tool_calls` (content null or empty, `arguments` a
  JSON string or object) and a row-level `tools` list handed to the chat template
- preference (dpo, orpo): {"prompt": str | messages, "chosen": str | messages, "rejected": str | messages}
- raw text (cpt): {"text": str}

Every example remembers the line it came from, so that a failure met mid-run names it.

Chat examples are rendered with the base tokenizer's OWN chat template and trained on
the assistant tokens only (tool calls included; tool results and user turns not; per-message
`weight` honoured), with the mask computed by `whetstone.modelkit.chat`.

Packing is padding-free: the examples of a micro-batch are concatenated into ONE row with
`position_ids` restarting at 0 for each example and no attention mask. The attention then
never crosses an example boundary (see `attention.py`), the first label of each example
is ignored (no next-token target across a boundary) and no pad token is ever computed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PlatformError, UserError

log = logging.getLogger("whetstone.trainer_agent.recipes")

SUPPORTED_ROLES = ("system", "user", "assistant", "tool")
IGNORE_INDEX = -100
FORMAT_FOR_METHOD = {"lora": "chat", "qlora": "chat", "full": "chat", "dpo": "preference",
                     "orpo": "preference", "cpt": "text"}
METHODS_FOR_FORMAT = {"chat": "lora, qlora or full", "preference": "dpo or orpo", "text": "cpt"}


# ------------------------------------------------------------------ reading


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed row) per non-blank line; UserError naming the line on bad JSON."""
    if not path.is_file():
        raise PlatformError(f"data file {path} does not exist", code="data_missing")
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((line_no, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path.name} line {line_no}: invalid JSON ({exc.msg})", code="bad_example") from exc
    if not rows:
        raise UserError(f"{path.name} has no rows", code="empty_dataset")
    return rows


def row_format(row: Any) -> str | None:
    if not isinstance(row, dict):
        return None
    if "chosen" in row or "rejected" in row:
        return "preference"
    if "messages" in row:
        return "chat"
    if "text" in row:
        return "text"
    return None


def check_format(rows: list[tuple[int, Any]], method: str, name: str) -> None:
    """A dataset whose rows do not fit the method is a user error, caught before training."""
    wanted = FORMAT_FOR_METHOD[method]
    for line_no, row in rows:
        found = row_format(row)
        if found is not None and found != wanted:
            raise UserError(
                f"{name} line {line_no}: method '{method}' needs {wanted} rows but this is a {found} row "
                f"(fits method {METHODS_FOR_FORMAT[found]})", code="method_dataset_mismatch")


@dataclass(frozen=True)
class Chat:
    """One SFT row: its messages and the tool definitions the template renders (None: no tools)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


def read_chat_jsonl(path: Path) -> list[tuple[int, Chat]]:
    """(line number, messages) per non-blank line; UserError naming the line on bad data."""
    return [(line_no, _validate_chat(row, path.name, line_no)) for line_no, row in read_jsonl(path)]


def read_preference_jsonl(path: Path) -> list[tuple[int, dict[str, list[dict[str, Any]]]]]:
    return [(line_no, _validate_preference(row, path.name, line_no)) for line_no, row in read_jsonl(path)]


def read_text_jsonl(path: Path) -> list[tuple[int, str]]:
    out = []
    for line_no, row in read_jsonl(path):
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
            raise UserError(f"{path.name} line {line_no}: expected an object with a non-empty 'text' string",
                            code="bad_example")
        out.append((line_no, row["text"]))
    return out


def read_rows(path: Path, method: str) -> list[tuple[int, Any]]:
    if method == "reinforcement":   # prompts plus the grader's fields: checked by the RFT data gate (grpo.py)
        return read_jsonl(path)
    check_format(read_jsonl(path), method, path.name)
    reader = {"chat": read_chat_jsonl, "preference": read_preference_jsonl, "text": read_text_jsonl}
    return reader[FORMAT_FOR_METHOD[method]](path)


def _validate_chat(row: Any, name: str, line_no: int) -> Chat:
    where = f"{name} line {line_no}"
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
        raise UserError(f"{where}: expected an object with a non-empty 'messages' list", code="bad_example")
    _validate_messages(row["messages"], where)
    if not any(m.get("weight", 1 if m["role"] == "assistant" else 0) for m in row["messages"]):
        raise UserError(f"{where}: no trained message (needs an assistant message with weight 1)", code="bad_example")
    tools = row.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise UserError(f"{where}: 'tools' must be a list of tool definitions", code="bad_example")
        for j, tool in enumerate(tools):
            function = tool.get("function", tool)
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise UserError(f"{where}: tools[{j}] has no function 'name'", code="bad_example")
    return Chat(row["messages"], tools or None)


def _validate_messages(messages: list, where: str) -> None:
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise UserError(f"{where}: message {i} is not an object", code="bad_example")
        if message.get("role") not in SUPPORTED_ROLES:
            raise UserError(f"{where}: message {i} has role {message.get('role')!r}; expected one of "
                            f"{SUPPORTED_ROLES}", code="bad_example")
        calls = message.get("tool_calls")
        if calls is not None:
            _validate_tool_calls(calls, message["role"], f"{where}: message {i}")
        content = message.get("content")
        parts = isinstance(content, list) and content and all(isinstance(p, dict) for p in content)
        if not isinstance(content, str) and not (content is None and calls) and not parts:
            raise UserError(f"{where}: message {i} has no string 'content' (nor a list of content parts)",
                            code="bad_example")
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise UserError(f"{where}: message {i} has a non-string {key!r}", code="bad_example")
        weight = message.get("weight")
        if weight is not None and (isinstance(weight, bool) or weight not in (0, 1)):
            raise UserError(f"{where}: message {i} has weight {weight!r}; expected 0 or 1", code="bad_example")


def _validate_tool_calls(calls: Any, role: str, where: str) -> None:
    """OpenAI's `[{"id"?, "type": "function", "function": {"name", "arguments"}}]`, on assistant turns only."""
    if role != "assistant":
        raise UserError(f"{where} has 'tool_calls' but role {role!r} (only assistant turns call tools)",
                        code="bad_example")
    if not isinstance(calls, list) or not calls:
        raise UserError(f"{where}: 'tool_calls' must be a non-empty list", code="bad_example")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise UserError(f"{where}: tool_calls[{j}] needs a function with a 'name'", code="bad_example")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise UserError(f"{where}: tool_calls[{j}] arguments are not valid JSON", code="bad_example") from None
        if not isinstance(arguments, dict):
            raise UserError(f"{where}: tool_calls[{j}] arguments must be a JSON object", code="bad_example")


def _validate_preference(row: Any, name: str, line_no: int) -> dict[str, list[dict[str, Any]]]:
    where = f"{name} line {line_no}"
    if not isinstance(row, dict) or not all(k in row for k in ("prompt", "chosen", "rejected")):
        raise UserError(f"{where}: expected 'prompt', 'chosen' and 'rejected'", code="bad_example")
    pair = {
        "prompt": _as_messages(row["prompt"], "user", where, "prompt"),
        "chosen": _as_messages(row["chosen"], "assistant", where, "chosen"),
        "rejected": _as_messages(row["rejected"], "assistant", where, "rejected"),
    }
    for key in ("chosen", "rejected"):
        if pair[key][-1]["role"] != "assistant":
            raise UserError(f"{where}: '{key}' must end with an assistant message", code="bad_example")
    if pair["chosen"] == pair["rejected"]:
        raise UserError(f"{where}: 'chosen' and 'rejected' are identical", code="bad_example")
    return pair


def _as_messages(value: Any, role: str, where: str, key: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{where}: '{key}' is empty", code="bad_example")
        return [{"role": role, "content": value}]
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: '{key}' must be a string or a non-empty list of messages", code="bad_example")
    _validate_messages(value, f"{where} '{key}'")
    return [dict(m) for m in value]  # extra keys (tool_calls, name, weight...) kept for the template


# ------------------------------------------------------------------ tokenization


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]
    line: int

    def as_row(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "labels": self.labels, "line": self.line}


def tokenize_chat_rows(tokenizer, rows, max_seq_len: int, name: str) -> list[Example]:
    """Platform-masked examples; rows whose trained tokens are all truncated away are dropped."""
    from jinja2 import TemplateError
    from whetstone.modelkit.chat import ChatFormatError, tokenize_chat

    examples, dropped = [], []
    for line_no, chat in rows:
        messages, tools = (chat.messages, chat.tools) if isinstance(chat, Chat) else (chat, None)
        try:
            tokens = tokenize_chat(tokenizer, messages, max_seq_len, **({"tools": tools} if tools else {}))
        except ChatFormatError as exc:
            raise UserError(f"{name} line {line_no}: {exc}", code="bad_example") from exc
        except TemplateError as exc:  # e.g. raise_exception() in the model's own chat template
            raise UserError(f"{name} line {line_no}: chat template rejected the conversation ({exc})",
                            code="bad_example") from exc
        if any(label != IGNORE_INDEX for label in tokens["labels"][1:]):
            examples.append(Example(tokens["input_ids"], tokens["labels"], line_no))
        else:
            dropped.append(line_no)
    return _kept(examples, dropped, name, max_seq_len)


def tokenize_text_rows(tokenizer, rows, max_seq_len: int, name: str) -> list[Example]:
    """Continued pre-training: every token trained; long documents are cut into max_seq_len chunks."""
    examples, dropped = [], []
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for line_no, text in rows:
        ids = bos + tokenizer(text, add_special_tokens=False)["input_ids"] + eos
        for start in range(0, len(ids), max_seq_len):
            chunk = ids[start:start + max_seq_len]
            if len(chunk) >= 2:
                examples.append(Example(chunk, list(chunk), line_no))
            else:
                dropped.append(line_no)
    return _kept(examples, dropped, name, max_seq_len)


def _kept(examples: list[Example], dropped: list[int], name: str, max_seq_len: int) -> list[Example]:
    if dropped:
        log.warning("%s: %d rows have no trained tokens within max_seq_len=%d (lines %s...)",
                    name, len(dropped), max_seq_len, dropped[:10])
    if not examples:
        raise UserError(f"{name}: no row has trained tokens within max_seq_len={max_seq_len}", code="empty_dataset")
    return examples


# ------------------------------------------------------------------ collators


def examples_by_line(examples: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Tokenized rows grouped by their source line (to re-run a failing micro-batch example by example)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for row in examples:
        out.setdefault(row["line"], []).append(row)
    return out


class TokenCounter:
    """Real (example) tokens vs tokens actually fed to the model: the padding overhead."""

    def __init__(self) -> None:
        self.real = 0
        self.computed = 0

    @property
    def non_padding_fraction(self) -> float:
        return self.real / self.computed if self.computed else 1.0


class PaddingFreeCollator:
    """Packs a micro-batch into one row: positions restart per example, no attention mask."""

    def __init__(self, counter: TokenCounter | None = None, poison=None) -> None:
        self.counter = counter or TokenCounter()
        self.poison = poison  # test-only fault hook (faults.py)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        input_ids, labels, positions, lines = [], [], [], []
        for f in features:
            ids = self.poison(f["input_ids"], f["line"]) if self.poison else f["input_ids"]
            input_ids += ids
            labels += [IGNORE_INDEX, *f["labels"][1:]]  # no target across the boundary
            positions += range(len(ids))
            lines.append(f["line"])
        self.counter.real += len(input_ids)
        self.counter.computed += len(input_ids)
        return {
            "input_ids": torch.tensor([input_ids], dtype=torch.long),
            "labels": torch.tensor([labels], dtype=torch.long),
            "position_ids": torch.tensor([positions], dtype=torch.long),
            "example_lines": torch.tensor(lines, dtype=torch.long),
        }


class PaddedCollator:
    """Classic batches: right-padded to the longest example of the micro-batch."""

    def __init__(self, pad_id: int, counter: TokenCounter | None = None, poison=None) -> None:
        self.pad_id = pad_id
        self.counter = counter or TokenCounter()
        self.poison = poison

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        rows = [self.poison(f["input_ids"], f["line"]) if self.poison else f["input_ids"] for f in features]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        for i, (ids, f) in enumerate(zip(rows, features)):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attention[i, : len(ids)] = 1
            labels[i, : len(ids)] = torch.tensor(f["labels"])
        self.counter.real += int(attention.sum())
        self.counter.computed += input_ids.numel()
        return {"input_ids": input_ids, "attention_mask": attention, "labels": labels,
                "example_lines": torch.tensor([f["line"] for f in features], dtype=torch.long)}
