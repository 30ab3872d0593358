"""Template strings in graders: `{{item.a.b}}`, `{{sample.output_text}}`, `{{sample.output_json.a}}`.

Only these two namespaces resolve; any other `{{...}}` is refused when the grader is validated. A
path segment is a key of an object or, when it is all digits, an index of a list. A value that is
not a string is rendered as compact JSON. A missing item field raises `MissingField` (the caller
made a request that cannot be graded); a missing or unparseable `sample.output_json` path raises
`SampleParseError` (the model's output did not have the shape asked for)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from .errors import GraderInvalid

TAG = re.compile(r"\{\{(.*?)\}\}", re.S)
PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*|[0-9]+")


class MissingField(Exception):
    """An `{{item...}}` path names a field the item does not have."""

    def __init__(self, template: str, path: str, message: str) -> None:
        super().__init__(message)
        self.template, self.path = template, path


class SampleParseError(Exception):
    """`{{sample.output_json...}}` on an output that is not JSON or lacks the path."""


@dataclass(frozen=True)
class Ref:
    namespace: str            # "item" or "sample"
    path: tuple[str, ...]     # segments after the namespace

    def __str__(self) -> str:
        return ".".join((self.namespace, *self.path))


@dataclass(frozen=True)
class Sample:
    """The `sample` namespace: the model's output text, and its JSON when the text is JSON."""
    output_text: str
    output_json: Any = None
    is_json: bool = False

    @classmethod
    def of(cls, text: str) -> Sample:
        try:
            return cls(text, json.loads(text), True)
        except (ValueError, RecursionError):
            return cls(text)

    def as_dict(self) -> dict[str, JsonValue]:
        return {"output_text": self.output_text, "output_json": self.output_json if self.is_json else None}


def parse_ref(expr: str, where: str) -> Ref:
    text = expr.strip()
    segments = text.split(".")
    if not all(PATH.fullmatch(s) for s in segments) or len(segments) < 2:
        raise GraderInvalid(where, f"template {{{{{text}}}}} is not a path such as item.field or sample.output_text")
    head, rest = segments[0], tuple(segments[1:])
    if head == "item":
        return Ref("item", rest)
    if head == "sample":
        if rest == ("output_text",) or (rest[0] == "output_json"):
            return Ref("sample", rest)
        raise GraderInvalid(where, f"template {{{{{text}}}}}: only sample.output_text and sample.output_json.<path> "
                                   "resolve in the sample namespace")
    raise GraderInvalid(where, f"template {{{{{text}}}}}: only the item and sample namespaces resolve "
                               "({{item.<field>}}, {{sample.output_text}}, {{sample.output_json.<field>}})")


def refs(template: str, where: str) -> Iterator[Ref]:
    """Every reference in `template` (raises GraderInvalid on a malformed one)."""
    for match in TAG.finditer(template):
        yield parse_ref(match.group(1), where)


def lookup(value: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    for segment in path:
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return False, None
    return True, value


def show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def resolve(ref: Ref, sample: Sample, item: Any, where: str) -> Any:
    if ref.namespace == "item":
        found, value = lookup(item, ref.path)
        if not found:
            raise MissingField(where, str(ref), f"{where}: {{{{{ref}}}}} names a field the item does not have")
        return value
    if ref.path == ("output_text",):
        return sample.output_text
    if not sample.is_json:
        raise SampleParseError(f"{where}: {{{{{ref}}}}} needs the sample to be JSON; the model's output is not")
    found, value = lookup(sample.output_json, ref.path[1:])
    if not found:
        raise SampleParseError(f"{where}: {{{{{ref}}}}} is not in the sample's JSON output")
    return value


def render(template: str, sample: Sample, item: Any, where: str) -> str:
    def one(match: re.Match[str]) -> str:
        return show(resolve(parse_ref(match.group(1), where), sample, item, where))

    return TAG.sub(one, template)
