"""One row at a time: JSON line parsing, schema detection across the file, PII handling. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from . import pii
from .issues import Issue
from .schemas import PURPOSE_SCHEMAS, default_purpose, detect_schema, validate_row

BOM = b"\xef\xbb\xbf"


def parse_json_line(raw: bytes, line: int) -> tuple[dict | None, Issue | None]:
    """A JSONL line (without its newline) -> the object, or the one issue that stops it."""
    if raw.startswith(BOM):
        return None, Issue("bom", "line starts with a UTF-8 byte-order mark; save the file as UTF-8 without BOM", line)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, Issue("bad_encoding", f"invalid UTF-8 at byte {exc.start} of the line", line)
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, Issue("invalid_json", f"invalid JSON: {exc.msg} at column {exc.colno}", line)
    except RecursionError:
        return None, Issue("invalid_json", "invalid JSON: nested too deeply", line)
    if not isinstance(row, dict):
        return None, Issue("row_not_object", f"each line must be a JSON object, not {type(row).__name__}", line)
    return row, None


@dataclass
class SchemaGate:
    """The first recognisable row fixes the file's schema; rows of another schema are errors."""

    purpose: str | None = None          # None: follow the schema
    schema: str | None = None
    schema_line: int | None = None
    file_issues: list[Issue] = field(default_factory=list)

    def check(self, row: dict, line: int) -> tuple[str | None, list[Issue]]:
        found = detect_schema(row)
        if found is None:
            keys = ", ".join(sorted(map(str, row))[:8]) or "no keys"
            return None, [Issue("unknown_schema", f"row matches no supported schema (keys: {keys})", line)]
        if self.schema is None:
            self._fix(found, line)
        elif found != self.schema:
            return found, [Issue("mixed_schema", f"row has the {found} schema but the file is {self.schema} "
                                 f"(from line {self.schema_line}); one schema per file", line)]
        return found, validate_row(row, found, line)

    def _fix(self, schema: str, line: int) -> None:
        self.schema, self.schema_line = schema, line
        if self.purpose is None:
            self.purpose = default_purpose(schema)
        elif schema not in PURPOSE_SCHEMAS[self.purpose]:
            allowed = ", ".join(PURPOSE_SCHEMAS[self.purpose])
            self.file_issues.append(Issue(
                "schema_purpose_mismatch", f"the file has the {schema} schema, which cannot be used for purpose "
                f"{self.purpose!r} (it takes: {allowed}); submit it with purpose {default_purpose(schema)!r}", line))


def map_contents(out: dict, fn: Callable[[str], str]) -> dict:
    """A normalized row with `fn` applied to every message content (or the text)."""
    def msgs(ms: list[dict]) -> list[dict]:
        return [{**m, "content": fn(m["content"])} for m in ms]
    if "messages" in out:
        return {"messages": msgs(out["messages"])}
    if "chosen" in out:
        return {"prompt": msgs(out["prompt"]), "chosen": msgs(out["chosen"]), "rejected": msgs(out["rejected"])}
    return {"text": fn(out["text"])}


def contents(out: dict) -> list[str]:
    if "messages" in out:
        return [m["content"] for m in out["messages"]]
    if "chosen" in out:
        return [m["content"] for side in ("prompt", "chosen", "rejected") for m in out[side]]
    return [out["text"]]


@dataclass
class PiiResult:
    row: dict
    counts: dict[str, int]


def apply_pii(out: dict, policy: str) -> PiiResult:
    """Scan every content; with policy 'redact' the returned row has placeholders instead."""
    counts: dict[str, int] = {}
    found: dict[str, list[pii.PiiMatch]] = {}
    texts = contents(out)
    joined = "\n".join(texts)
    if not pii.might_contain(joined) and not ("=" in joined or ":" in joined):
        return PiiResult(out, counts)
    for text in texts:
        matches = pii.scan(text)
        if matches:
            found[text] = matches
            for m in matches:
                counts[m.kind] = counts.get(m.kind, 0) + 1
    if found and policy == "redact":
        out = map_contents(out, lambda t: pii.redact(t, found[t]) if t in found else t)
    return PiiResult(out, counts)


def role_counts(out: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    if "text" in out:
        return {"text": 1}
    for side in ("messages", "prompt", "chosen", "rejected"):
        for m in out.get(side, ()):
            counts[m["role"]] = counts.get(m["role"], 0) + 1
    return counts
