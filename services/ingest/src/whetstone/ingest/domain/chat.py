"""Line-by-line validation of chat JSONL. Pure: bytes in, rows and issues out."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

ROLES = {"system", "user", "assistant"}
MESSAGE_KEYS = {"role", "content", "weight", "name"}
ROW_KEYS = {"messages"}
MAX_LISTED_ISSUES = 100


@dataclass(frozen=True)
class Issue:
    code: str
    message: str
    line: int | None = None
    field: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "line": self.line, "field": self.field}


def check_messages(messages: Any, line: int) -> list[Issue]:
    if not isinstance(messages, list) or not messages:
        return [Issue("messages_not_list", "`messages` must be a non-empty list", line, "messages")]
    issues: list[Issue] = []
    seen_user = False
    prev_role = None
    has_assistant = False
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            issues.append(Issue("message_not_object", f"{where} must be an object", line, where))
            continue
        unknown = sorted(set(m) - MESSAGE_KEYS)
        if unknown:
            issues.append(Issue("unknown_key", f"{where} has unknown key(s): {', '.join(unknown)}", line, where))
        role, content = m.get("role"), m.get("content")
        if "role" not in m:
            issues.append(Issue("missing_key", f"{where} has no `role`", line, where + ".role"))
        elif role not in ROLES:
            issues.append(Issue("unknown_role", f"{where}.role {role!r} is not one of system/user/assistant",
                                line, where + ".role"))
        if "content" not in m:
            issues.append(Issue("missing_key", f"{where} has no `content`", line, where + ".content"))
        elif not isinstance(content, str):
            issues.append(Issue("content_not_string", f"{where}.content must be a string", line, where + ".content"))
        elif not content.strip():
            issues.append(Issue("empty_content", f"{where}.content is empty", line, where + ".content"))
        if "weight" in m and m["weight"] not in (0, 1) or isinstance(m.get("weight"), bool):
            issues.append(Issue("bad_weight", f"{where}.weight must be 0 or 1", line, where + ".weight"))
        if role == "system" and i > 0:
            issues.append(Issue("role_order", f"{where}: system message after the first turn", line, where))
        if role == "assistant":
            has_assistant = True
            if not seen_user:
                issues.append(Issue("role_order", f"{where}: assistant before any user message", line, where))
            if prev_role == "assistant":
                issues.append(Issue("role_order", f"{where}: two assistant messages in a row", line, where))
        if role == "user":
            seen_user = True
        prev_role = role
    if not has_assistant:
        issues.append(Issue("no_assistant", "conversation has no assistant turn", line, "messages"))
    return issues


def parse_line(raw: bytes, line: int) -> tuple[dict | None, list[Issue]]:
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
        return None, [Issue("bom", "file starts with a UTF-8 byte-order mark; save without BOM", line)]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [Issue("bad_encoding", f"invalid UTF-8 at byte {exc.start}", line)]
    if not text.strip():
        return None, [Issue("empty_line", "blank line", line)]
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [Issue("invalid_json", f"invalid JSON: {exc.msg} at column {exc.colno}", line)]
    if not isinstance(row, dict):
        return None, [Issue("row_not_object", "each line must be a JSON object", line)]
    issues = []
    unknown = sorted(set(row) - ROW_KEYS)
    if unknown:
        issues.append(Issue("unknown_key", f"unknown top-level key(s): {', '.join(unknown)}", line))
    if "messages" not in row:
        issues.append(Issue("missing_key", "missing `messages`", line, "messages"))
    else:
        issues += check_messages(row["messages"], line)
    return (row if not issues else None), issues


def normalized_hash(row: dict) -> str:
    text = "\x1e".join(f"{m.get('role')}\x1f{' '.join(unicodedata.normalize('NFKC', m.get('content', '')).split()).lower()}"
                       for m in row["messages"])
    return hashlib.sha256(text.encode()).hexdigest()


def in_validation_split(digest: str, fraction: float) -> bool:
    """Deterministic split by content hash: the same example always lands on the same side."""
    return int(digest[:8], 16) / 0xFFFFFFFF < fraction


@dataclass
class Report:
    rows_total: int = 0
    rows_kept: int = 0
    exact_duplicates: int = 0
    train_rows: int = 0
    validation_rows: int = 0
    error_count: int = 0
    errors: list[Issue] = field(default_factory=list)
    warnings: list[Issue] = field(default_factory=list)
    error_counts: dict[str, int] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=lambda: {r: 0 for r in ROLES})
    chars_total: int = 0

    def add_error(self, issue: Issue) -> None:
        self.error_count += 1
        self.error_counts[issue.code] = self.error_counts.get(issue.code, 0) + 1
        if len(self.errors) < MAX_LISTED_ISSUES:
            self.errors.append(issue)


def validate_chat_lines(lines: Iterable[bytes], *, min_examples: int = 10, max_examples: int = 1_000_000,
                        validation_fraction: float = 0.1) -> Iterator[tuple[str, dict]]:
    """Stream ('train'|'validation', row) for the clean, de-duplicated rows; the Report is
    returned as the generator's value (``StopIteration.value``) — use run_validation."""
    report = Report()
    seen: set[str] = set()
    for lineno, raw in enumerate(lines, start=1):
        raw = raw.rstrip(b"\r\n")
        if not raw.strip() and lineno > 1:
            continue  # trailing/blank lines are tolerated
        report.rows_total += 1
        row, issues = parse_line(raw, lineno)
        for issue in issues:
            report.add_error(issue)
        if row is None:
            continue
        for m in row["messages"]:
            report.turns[m["role"]] += 1
            report.chars_total += len(m["content"])
        digest = normalized_hash(row)
        if digest in seen:
            report.exact_duplicates += 1
            continue
        seen.add(digest)
        report.rows_kept += 1
        side = "validation" if in_validation_split(digest, validation_fraction) else "train"
        setattr(report, f"{side}_rows", getattr(report, f"{side}_rows") + 1)
        yield side, row
    if report.rows_kept < min_examples:
        report.add_error(Issue("too_few_examples",
                               f"{report.rows_kept} usable examples; at least {min_examples} are required"))
    if report.rows_kept > max_examples:
        report.add_error(Issue("too_many_examples", f"{report.rows_kept} examples; this tier allows {max_examples}"))
    if report.exact_duplicates:
        report.warnings.append(Issue("exact_duplicates", f"{report.exact_duplicates} exact duplicates removed"))
    return report


def run_validation(lines: Iterable[bytes], sink, **kwargs) -> Report:
    """Drive validate_chat_lines, handing every kept row to ``sink(side, row)``."""
    gen = validate_chat_lines(lines, **kwargs)
    while True:
        try:
            side, row = next(gen)
        except StopIteration as stop:
            return stop.value
        sink(side, row)
