"""Rows and jsonb documents <-> metering's dataclasses, field by field.

Each dataclass field is converted by its declared type: a StrEnum from its string, a tuple from
a Postgres array, a nested state dataclass from its jsonb text (`from_json`), and, inside a JSON
document, a datetime from its ISO 8601 text and a Decimal from its digits."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, TypeVar

import orjson

T = TypeVar("T")
Convert = Callable[[Any], Any]


def _optional(convert: Convert) -> Convert:
    return lambda v: None if v is None else convert(v)


def _converter(hint: Any, in_json: bool) -> Convert | None:
    """How a value of a field declared `hint` is rebuilt (None: taken as it is)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        convert = _converter(inner[0], in_json) if len(inner) == 1 else None
        return _optional(convert) if convert is not None else None
    if typing.get_origin(hint) is tuple:
        return tuple
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return hint
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        cls = hint
        return lambda text: from_json(cls, text)
    if in_json and hint is datetime:
        return datetime.fromisoformat
    if in_json and hint is Decimal:
        return Decimal
    return None


_FIELDS: dict[tuple[type, bool], tuple[tuple[str, Convert | None], ...]] = {}


def _fields(cls: type, in_json: bool) -> tuple[tuple[str, Convert | None], ...]:
    """Each field's name and converter, worked out once per class."""
    found = _FIELDS.get((cls, in_json))
    if found is None:
        hints = typing.get_type_hints(cls)
        found = _FIELDS[cls, in_json] = tuple((f.name, _converter(hints[f.name], in_json))
                                              for f in dataclasses.fields(cls))
    return found


def _build(cls: type[T], values: Mapping[str, Any], in_json: bool) -> T:
    """A JSON document may leave out a None field; a row has every column."""
    kwargs = {}
    for name, convert in _fields(cls, in_json):
        v = values.get(name) if in_json else values[name]
        kwargs[name] = v if convert is None or v is None else convert(v)
    return cls(**kwargs)


def from_record(cls: type[T], record: Mapping[str, Any]) -> T:
    """A dataclass from a row whose columns are named as its fields."""
    return _build(cls, record, in_json=False)


def from_records(cls: type[T], records: Sequence[Mapping[str, Any]]) -> list[T]:
    return [_build(cls, r, in_json=False) for r in records]


def from_json(cls: type[T], text: str | None) -> T | None:
    """A state dataclass from the JSON text `to_json` wrote (None stays None)."""
    if text is None:
        return None
    return _build(cls, orjson.loads(text), in_json=True)


def to_json(obj: object) -> str | None:
    """A state dataclass as JSON text (orjson: datetimes in ISO 8601, Decimals as strings, StrEnums as
    their values). Text, cast to jsonb in SQL: the pool's jsonb codec would dump it a second time."""
    if obj is None:
        return None
    return orjson.dumps(obj, default=str).decode()


def states_json(states: Sequence[object]) -> str:
    """State dataclasses as one JSON array of objects, for jsonb_to_recordset: one orjson call
    instead of an array parameter per column (each element of which asyncpg checks and encodes
    one by one). Nested dataclasses come out exactly as `to_json` writes them; the datetimes are
    ISO 8601 with their offset, which Postgres reads back to the microsecond."""
    return orjson.dumps(states, default=str).decode()
