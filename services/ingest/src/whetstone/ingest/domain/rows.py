"""One row at a time: JSON line parsing, layout detection across the file, PII handling. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import pii
from .chat import part_text
from .issues import Issue
from .jsontypes import JsonObject
from .layouts import LAYOUTS, Layout, RowFacts, choose, key_issues
from .normal import NormalRow, TextRow
from .schemas import PURPOSE_SCHEMAS, default_purpose

BOM = b"\xef\xbb\xbf"


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> float:
    raise _NonFinite(name)


# NaN / Infinity / -Infinity are not JSON (RFC 8259); Python's parser accepts them unless told.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def decode_json(text: str) -> Any:
    """Strict JSON: raises ValueError (json.JSONDecodeError, or for NaN/Infinity literals) on bad input."""
    return _DECODER.decode(text)


def parse_json_line(raw: bytes, line: int) -> tuple[JsonObject | None, Issue | None]:
    """A JSONL line (without its newline) -> the object, or the one issue that stops it."""
    if raw.startswith(BOM):
        return None, Issue("bom", "a UTF-8 byte-order mark inside the file (files joined together?); remove it", line)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if b"\x00" in raw:
            return None, _nul(raw, line)
        return None, Issue("bad_encoding", f"invalid UTF-8 at byte {exc.start} of the line", line)
    try:
        row = _DECODER.decode(text)
    except _NonFinite as exc:
        return None, Issue("invalid_number", f"`{exc}` is not valid JSON; write null or a finite number", line)
    except json.JSONDecodeError as exc:
        if "\x00" in text:
            return None, _nul(raw, line)
        return None, Issue("invalid_json", f"invalid JSON: {exc.msg} at column {exc.colno}", line)
    except RecursionError:
        return None, Issue("invalid_json", "invalid JSON: nested too deeply", line)
    if not isinstance(row, dict):
        return None, Issue("row_not_object", f"each line must be a JSON object, not {type(row).__name__}", line)
    return row, None


def _nul(raw: bytes, line: int) -> Issue:
    at = raw.index(b"\x00") + 1
    return Issue("binary_content", f"NUL byte at byte {at} of the line: binary or corrupt content "
                 "(is this a text file saved as UTF-8?)", line)


@dataclass
class Read:
    """One row read: its layout and normalised form, or its issues."""

    layout: Layout | None
    issues: list[Issue]
    out: NormalRow | None = None


@dataclass
class LayoutGate:
    """Reads rows: the first recognisable row fixes the file's schema; rows of another schema
    are errors. Counts rows per layout, ignored keys and role mappings for the report."""

    purpose: str | None = None          # None: follow the schema
    schema: str | None = None
    schema_line: int | None = None
    file_issues: list[Issue] = field(default_factory=list)
    layout_counts: dict[str, int] = field(default_factory=dict)
    ambiguous: dict[str, int] = field(default_factory=dict)     # "a or b" -> rows read as a by default
    facts: RowFacts = field(default_factory=RowFacts)

    def read(self, row: JsonObject, line: int) -> Read:
        choice = choose(row, self.purpose, self.schema)
        layout = choice.layout
        issues = key_issues(row, layout, line, self.facts) if layout is None or row.keys() != layout.required else []
        if layout is None:
            if not issues:
                keys = ", ".join(sorted(map(str, row))[:8]) or "no keys"
                issues = [Issue("unknown_schema", f"row matches no supported layout (keys: {keys})", line)]
            return Read(None, issues)
        if self.schema is None:
            self._fix(layout.schema, line)
        elif layout.schema != self.schema:
            return Read(layout, [Issue("mixed_schema", f"row has the {layout.schema} schema ({layout.name}) but the "
                                       f"file is {self.schema} (from line {self.schema_line}); one schema per file",
                                       line)])
        if choice.alternatives:
            key = " or ".join((layout.name, *choice.alternatives))
            self.ambiguous[key] = self.ambiguous.get(key, 0) + 1
        if issues:
            return Read(layout, issues)
        issues = layout.validate(row, line, self.facts)
        if issues:
            return Read(layout, issues)
        self.layout_counts[layout.name] = self.layout_counts.get(layout.name, 0) + 1
        return Read(layout, [], layout.normalize(row))

    @property
    def layout(self) -> str | None:
        """The file's layout: the one most rows were read as."""
        return max(self.layout_counts, key=self.layout_counts.__getitem__) if self.layout_counts else None

    def role_mapping(self) -> dict[str, dict[str, str]]:
        mapping = {name: dict(LAYOUTS[name].roles) for name in self.layout_counts if LAYOUTS[name].roles}
        return {**mapping, **{k: v for k, v in self.facts.role_mapping.items() if k in self.layout_counts}}

    def _fix(self, schema: str, line: int) -> None:
        self.schema, self.schema_line = schema, line
        if self.purpose is None:
            self.purpose = default_purpose(schema)
        elif schema not in PURPOSE_SCHEMAS[self.purpose]:
            allowed = ", ".join(PURPOSE_SCHEMAS[self.purpose])
            self.file_issues.append(Issue(
                "schema_purpose_mismatch", f"the file has the {schema} schema, which cannot be used for purpose "
                f"'{self.purpose}' (it takes: {allowed}); submit it with purpose '{default_purpose(schema)}'", line))


# ------------------------------------------------------------------------------- PII


def _map_content(content: str | list[Any], fn: Callable[[str], str]) -> str | list[Any]:
    if isinstance(content, str):
        return fn(content)
    return [{**p, "text": fn(p["text"])} if p["type"] == "text" else p for p in content]


def _map_message(m: JsonObject, fn: Callable[[str], str]) -> JsonObject:
    out = {**m, "content": _map_content(m["content"], fn)}
    if m.get("tool_calls"):
        out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": fn(c["function"]["arguments"])}}
                             for c in m["tool_calls"]]
    return out


def map_contents(out: NormalRow, fn: Callable[[str], str]) -> NormalRow:
    """A normalized row with `fn` applied to every message content and tool-call arguments (or the text)."""
    if isinstance(out, TextRow):
        return TextRow(fn(out.text))
    return out.map_messages(lambda ms: [_map_message(m, fn) for m in ms])


def contents(out: NormalRow) -> list[str]:
    if isinstance(out, TextRow):
        return [out.text]
    messages = out.all_messages()
    texts = [m["content"] if type(m["content"]) is str else part_text(m["content"]) for m in messages]
    for m in messages:
        texts += [c["function"]["arguments"] for c in m.get("tool_calls") or ()]
    return texts


@dataclass
class PiiResult:
    row: NormalRow
    counts: dict[str, int]


def apply_pii(out: NormalRow, policy: str) -> PiiResult:
    """Scan every content; with policy 'redact' the returned row has placeholders instead."""
    counts: dict[str, int] = {}
    found: dict[str, list[pii.PiiMatch]] = {}
    texts = contents(out)
    joined = "\n".join(texts)
    if not ("=" in joined or ":" in joined) and not pii.might_contain(joined):
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


def role_counts(out: NormalRow) -> dict[str, int]:
    if isinstance(out, TextRow):
        return {"text": 1}
    counts: dict[str, int] = {}
    for m in out.all_messages():
        counts[m["role"]] = counts.get(m["role"], 0) + 1
    return counts
