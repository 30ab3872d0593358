"""Delivery rules shared by every consumer: what a poison message is, how a dead letter is
bounded, which failures are a dependency's (retried for minutes) rather than the message's, and
the retention of the runtime's own tables."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import TYPE_CHECKING, Any

from whetstone.contracts import DLQ_MODEL

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
    """Failures of a dependency (Postgres, S3, the network, the Hub) rather than of the message."""
    import asyncpg  # noqa: PLC0415
    from botocore.exceptions import ConnectionError as BotoConnectionError  # noqa: PLC0415
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError  # noqa: PLC0415

    transient = (ConnectionError, TimeoutError, asyncpg.exceptions.ConnectionDoesNotExistError,
                 asyncpg.exceptions.CannotConnectNowError, asyncpg.exceptions.TooManyConnectionsError,
                 BotoConnectionError, ConnectTimeoutError, ReadTimeoutError)
    seen: BaseException | None = exc
    while seen is not None:  # the cause may be wrapped
        if isinstance(seen, transient):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def dead_letter(topic: str, partition: int, offset: int, consumer: str, attempts: int, error: str, key: str | None,
                raw: bytes) -> Any:
    """A bounded dead letter: at most DLQ_VALUE_LIMIT bytes of the record, as text when it is UTF-8
    (base64 otherwise), with the whole record's size and sha256, so it always fits the producer."""
    head = raw[:DLQ_VALUE_LIMIT]
    try:
        value, encoding = head.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        if len(raw) > DLQ_VALUE_LIMIT and exc.start >= len(head) - 3:  # a character cut by the limit
            value, encoding = head[:exc.start].decode("utf-8"), "utf-8"
        else:
            value, encoding = base64.b64encode(head).decode("ascii"), "base64"
    return DLQ_MODEL(source_topic=topic, partition=partition, offset=offset, consumer=consumer, attempts=attempts,
                     error=error[:4000], key=key[:1000] if key else key, value=value, value_encoding=encoding,
                     value_bytes=len(raw), value_sha256=hashlib.sha256(raw).hexdigest(),
                     value_truncated=len(raw) > DLQ_VALUE_LIMIT)


async def prune_forever(rt: Runtime) -> None:
    """Retention of the runtime's tables: sent outbox rows, old inbox rows, delivery counts."""
    s = rt.settings
    while True:
        await asyncio.sleep(s.retention_interval_s)
        assert rt.pool is not None
        removed = await db.prune(rt.pool, outbox_sent_hours=s.outbox_retention_hours,
                                 inbox_days=s.inbox_retention_days, deliveries_hours=24.0)
        if any(removed.values()):
            rt.log.info("retention", **removed)
