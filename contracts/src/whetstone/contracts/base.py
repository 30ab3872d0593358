"""Base classes of the wire contract: strict when produced, tolerant when consumed."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from pydantic import (BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler,
                      SerializerFunctionWrapHandler, ValidationInfo, model_serializer, model_validator)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

TOLERANT = {"tolerant": True}
MAX_JSON_BYTES_KEY = "x-max-json-bytes"


@dataclass(frozen=True)
class JsonAtMost:
    """`Annotated[dict[str, Any], JsonAtMost(4096)]`: a free-form JSON value of at most `limit` bytes
    once serialised compactly (what an event then carries). Its JSON Schema says so
    (`x-max-json-bytes`), so a walker of request schemas sees the bound."""

    limit: int

    def check(self, value: Any) -> Any:
        data = value.model_dump(mode="json", exclude_none=True) if isinstance(value, BaseModel) else value
        if data is not None and len(json.dumps(data, separators=(",", ":"), default=str)) > self.limit:
            raise ValueError(f"at most {self.limit} bytes of JSON")
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        out[MAX_JSON_BYTES_KEY] = self.limit
        return out


# the field names and aliases each contract model accepts (Contract._forbid_unknown_fields)
_KNOWN_FIELDS: dict[type, frozenset[str]] = {}


class Contract(BaseModel):
    """Every wire model.

    Producers build instances with the constructor: unknown fields are an error
    (extra=forbid semantics).  Consumers validate with ``context=TOLERANT``:
    unknown fields sent by a newer producer are ignored.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _forbid_unknown_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and not (info.context or {}).get("tolerant"):
            known = _KNOWN_FIELDS.get(cls)
            if known is None:  # made once per model: hot paths build thousands of envelopes
                known = _KNOWN_FIELDS[cls] = frozenset(cls.model_fields) | {
                    f.alias for f in cls.model_fields.values() if f.alias}
            unknown = sorted(k for k in data if k not in known)
            if unknown:
                raise ValueError(f"unknown field(s) for {cls.__name__}: {', '.join(unknown)}")
        return data


class GivenFieldsOnly(Contract):
    """A contract whose JSON has only the fields its producer gave (and, where a model keeps them, the
    unknown keys it read): optional fields left out stay out, so a value read and written back is the
    JSON its producer built, key for key."""

    @model_serializer(mode="wrap")
    def _given_fields_only(self, handler: SerializerFunctionWrapHandler) -> Any:
        given = self.model_fields_set | set(self.model_extra or ())
        return {k: v for k, v in handler(self).items() if k in given}


class Event(Contract):
    """A versioned event payload. Subclasses set EVENT_TYPE and SCHEMA_VERSION."""

    EVENT_TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_trace_id() -> str:
    return uuid.uuid4().hex


class Envelope(Contract):
    """The frame of every Kafka message. ``payload`` is the typed event as JSON."""

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    event_type: str = Field(max_length=64)
    schema_version: int = 1
    occurred_at: datetime = Field(default_factory=utcnow)
    producer: str = Field(max_length=128)
    tenant_id: str = Field(max_length=128)
    trace_id: str = Field(default_factory=new_trace_id, max_length=128)
    key: str = Field(max_length=256)
    # its values are the typed event of `event_type`, validated (and bounded) by that model
    payload: dict[Annotated[str, Field(max_length=64)], Any] = Field(max_length=64)
    # External producers of `job.requested` prove who they publish for with a platform-signed
    # token (`whet keys create-producer TENANT`); services leave it unset on their own events.
    producer_token: str | None = Field(default=None, max_length=512,
                                       description="platform-signed producer token (external producers only)")
