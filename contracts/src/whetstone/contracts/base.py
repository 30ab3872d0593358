"""Base classes of the wire contract: strict when produced, tolerant when consumed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

TOLERANT = {"tolerant": True}


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
            known = set(cls.model_fields)
            known |= {f.alias for f in cls.model_fields.values() if f.alias}
            unknown = sorted(k for k in data if k not in known)
            if unknown:
                raise ValueError(f"unknown field(s) for {cls.__name__}: {', '.join(unknown)}")
        return data


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
    event_type: str
    schema_version: int = 1
    occurred_at: datetime = Field(default_factory=utcnow)
    producer: str
    tenant_id: str
    trace_id: str = Field(default_factory=new_trace_id)
    key: str
    payload: dict[str, Any]
    # External producers of `job.requested` prove who they publish for with a platform-signed
    # token (`whet keys create-producer TENANT`); services leave it unset on their own events.
    producer_token: str | None = Field(default=None, max_length=512,
                                       description="platform-signed producer token (external producers only)")
