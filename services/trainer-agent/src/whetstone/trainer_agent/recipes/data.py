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
from typing import TYPE_CHECKING, Any, TypedDict

from .errors import PlatformError, UserError
from .rows import ChatRow, PreferenceRow, TextRow, parse_row

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger("whetstone.trainer_agent.recipes")

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


def read_chat_jsonl(path: Path) -> list[tuple[int, ChatRow]]:
    """(line number, chat row) per non-blank line; UserError naming the line on bad data."""
    return [(line_no, parse_row(ChatRow, row, path.name, line_no)) for line_no, row in read_jsonl(path)]


def read_preference_jsonl(path: Path) -> list[tuple[int, PreferenceRow]]:
    return [(line_no, parse_row(PreferenceRow, row, path.name, line_no)) for line_no, row in read_jsonl(path)]


def read_text_jsonl(path: Path) -> list[tuple[int, str]]:
    return [(line_no, parse_row(TextRow, row, path.name, line_no).text) for line_no, row in read_jsonl(path)]


def read_rows(path: Path, method: str) -> list[tuple[int, Any]]:
    if method == "reinforcement":   # prompts plus the grader's fields: checked by the RFT data gate (grpo.py)
        return read_jsonl(path)
    check_format(read_jsonl(path), method, path.name)
    reader = {"chat": read_chat_jsonl, "preference": read_preference_jsonl, "text": read_text_jsonl}
    return reader[FORMAT_FOR_METHOD[method]](path)


# ------------------------------------------------------------------ tokenization


class ExampleRow(TypedDict):
    """A tokenized example as a row of the `datasets.Dataset` the Trainer iterates, and as the
    collators receive it."""

    input_ids: list[int]
    labels: list[int]
    line: int


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]
    line: int

    def as_row(self) -> ExampleRow:
        return ExampleRow(input_ids=self.input_ids, labels=self.labels, line=self.line)


def tokenize_chat_rows(tokenizer, rows: list[tuple[int, ChatRow]], max_seq_len: int, name: str) -> list[Example]:
    """Platform-masked examples; rows whose trained tokens are all truncated away are dropped."""
    from jinja2 import TemplateError
    from whetstone.modelkit.chat import ChatFormatError, tokenize_chat

    examples, dropped = [], []
    for line_no, chat in rows:
        messages, tools = chat.template_messages(), chat.template_tools()
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


def tokenize_text_rows(tokenizer, rows: list[tuple[int, str]], max_seq_len: int, name: str) -> list[Example]:
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


def examples_by_line(examples: list[Example]) -> dict[int, list[ExampleRow]]:
    """Tokenized rows grouped by their source line (to re-run a failing micro-batch example by example)."""
    out: dict[int, list[ExampleRow]] = {}
    for example in examples:
        out.setdefault(example.line, []).append(example.as_row())
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

    def __call__(self, features: list[ExampleRow]) -> dict[str, Tensor]:
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

    def __call__(self, features: list[ExampleRow]) -> dict[str, Tensor]:
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
