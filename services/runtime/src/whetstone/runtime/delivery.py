"""Delivery rules shared by every consumer: what a poison message is, how a dead letter is
bounded, which failures are a dependency's (retried for minutes) rather than the message's, and
the retention of the runtime's own tables. The same classification answers HTTP 503 (errors.py),
retries eval's claims and waits for the broker at start-up."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from typing import TYPE_CHECKING, Any

import asyncpg
from aiokafka import errors as kafka_errors
from botocore import exceptions as boto_errors

from whetstone.contracts import DLQ_MODEL
from whetstone.contracts.enums import ValueEncoding

from . import db

if TYPE_CHECKING:
    from .service import Runtime

# The producer's request limit is 1 MiB: an outbox row above this is quarantined, never sent.
MAX_RECORD_BYTES = 1_000_000
# A dead letter keeps at most this much of the original record (its size and sha256 are kept whole).
DLQ_VALUE_LIMIT = 64 * 1024


class PoisonMessage(Exception):
    """Raised by a handler for input that no retry can fix: dead-letter at once. `reason` is a
    short code counted in `whetstone_refused_total{reason}` (e.g. tenant_mismatch, stale_attempt)."""

    def __init__(self, message: str, reason: str = "rejected") -> None:
        super().__init__(message)
        self.reason = reason


def is_transient(exc: BaseException) -> bool:
    """Failures of a dependency (Postgres, S3, the broker, the network) rather than of the message."""
    return unavailable_dependency(exc) is not None


# the server is gone, shutting down, starting up or full; not a cancelled query (also in class 57)
_PG_DOWN = (asyncpg.PostgresConnectionError, asyncpg.exceptions.AdminShutdownError,
            asyncpg.exceptions.CrashShutdownError, asyncpg.exceptions.CannotConnectNowError,
            asyncpg.exceptions.TooManyConnectionsError)


# asyncpg's protocol left mid-message: the server sent its FATAL goodbye (shutting down) to a pooled
# connection and the socket's close was not seen yet when the next query started on it
_PG_PROTOCOL_BROKEN = ("cannot switch to state", "protocol is in an unexpected state",
                       "unknown error in protocol implementation")


def _dependency_of(exc: BaseException) -> str | None:
    if isinstance(exc, _PG_DOWN) or (isinstance(exc, asyncpg.InterfaceError)
                                     and any(w in str(exc) for w in ("connection", "pool is closing"))) or (
            isinstance(exc, asyncpg.exceptions.InternalClientError)
            and any(w in str(exc) for w in _PG_PROTOCOL_BROKEN)):
        return "database"
    if isinstance(exc, boto_errors.ConnectionError | boto_errors.HTTPClientError):
        return "object store"
    if isinstance(exc, boto_errors.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code", "")
        return "object store" if status >= 500 or code in ("SlowDown", "ServiceUnavailable") else None
    if isinstance(exc, kafka_errors.KafkaConnectionError | kafka_errors.KafkaTimeoutError) or (
            isinstance(exc, kafka_errors.KafkaError) and exc.retriable):
        return "broker"
    if isinstance(exc, OSError):  # a socket error (a missing unix socket too): named after the client that raised it
        tb, where = exc.__traceback__, "a dependency" if isinstance(exc, ConnectionError | TimeoutError) else None
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename
            where = next((name for lib, name in _CLIENTS if f"/{lib}/" in path), where)
            tb = tb.tb_next
        return where
    return None


_CLIENTS = (("asyncpg", "database"), ("botocore", "object store"), ("aiokafka", "broker"))


def unavailable_dependency(exc: BaseException) -> str | None:
    """What unreachable dependency ("database", "object store", "broker", "a dependency") caused `exc`,
    looking through causes, contexts and exception groups; None for anything else (a bug)."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if (found := _dependency_of(e)) is not None:
            return found
        todo += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            todo += e.exceptions
    return None


# credentials a record may carry (a producer token in its envelope, an API key pasted in a field):
# a dead letter keeps the part that names them and drops the part that proves them
SECRETS_IN_RECORDS = (
    (re.compile(rb"(whp_[0-9a-f]{16}\.[A-Za-z0-9_.:-]{1,128}\.)[0-9a-f]{32}"), rb"\1[redacted]"),
    (re.compile(rb"(wsk-[0-9a-f]{12}-)[0-9a-f]{48}"), rb"\1[redacted]"),
)


def redact(raw: bytes) -> bytes:
    for pattern, replacement in SECRETS_IN_RECORDS:
        raw = pattern.sub(replacement, raw)
    return raw


def dead_letter(topic: str, partition: int, offset: int, consumer: str, attempts: int, error: str, key: str | None,
                raw: bytes) -> Any:
    """A bounded dead letter: at most DLQ_VALUE_LIMIT bytes of the record, as text when it is UTF-8
    (base64 otherwise), with the whole record's size and sha256, so it always fits the producer.
    Producer tokens and API keys in the record or the error are redacted (size and sha256 are the
    original record's)."""
    error = redact(error.encode()).decode()
    head = redact(raw[:DLQ_VALUE_LIMIT])
    try:
        value, encoding = head.decode("utf-8"), ValueEncoding.UTF8
    except UnicodeDecodeError as exc:
        if len(raw) > DLQ_VALUE_LIMIT and exc.start >= len(head) - 3:  # a character cut by the limit
            value, encoding = head[:exc.start].decode("utf-8"), ValueEncoding.UTF8
        else:
            value, encoding = base64.b64encode(head).decode("ascii"), ValueEncoding.BASE64
    return DLQ_MODEL(source_topic=topic, partition=partition, offset=offset, consumer=consumer, attempts=attempts,
                     error=error[:4000], key=key[:1000] if key else key, value=value, value_encoding=encoding,
                     value_bytes=len(raw), value_sha256=hashlib.sha256(raw).hexdigest(),
                     value_truncated=len(raw) > DLQ_VALUE_LIMIT)


async def prune_forever(rt: Runtime[Any]) -> None:
    """Retention of the runtime's tables (sent outbox rows, old inbox rows, delivery counts) and of
    the service's tables kept as long as the inbox."""
    s = rt.settings
    while True:
        await asyncio.sleep(s.retention_interval_s)
        assert rt.pool is not None
        removed = await db.prune(rt.pool, outbox_sent_hours=s.outbox_retention_hours,
                                 inbox_days=s.inbox_retention_days, deliveries_hours=24.0,
                                 kept_like_inbox=rt.service.kept_like_inbox)
        if any(removed.values()):
            rt.log.info("retention", **removed)
