"""Dead letters on the broker: read a `<topic>.dlq`, count every topic's letters, and redrive them.

A redriven letter is the original record, unchanged (same event_id), put back on its source topic:
the consumer handles it through its normal inbox, so replaying a letter twice, or one whose event
was handled since, has no second effect. Letters that cannot be replayed as they are (not a valid
envelope, kept only in part, or not UTF-8) are listed with the reason and left alone. A redriven
letter stays in its dead-letter topic (topics are append-only); counts include it.

Used by `whet dlq` and by the scheduler's operator routes (the console's operator view)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from whetstone.contracts import Envelope
from whetstone.contracts.topics import DLQ_SUFFIX

from .settings import KafkaClientOptions

IDLE_MS = 300   # a read ends after the broker has had nothing more for this long


class LetterPayload(BaseModel):
    """A dead letter's payload (contracts' DeadLetterV1), read leniently: a field it lacks is its default."""

    source_topic: str | None = None
    key: str | None = None
    error: str = ""
    attempts: int = 0
    value: str = ""
    value_encoding: str = "utf-8"
    value_bytes: int | None = None
    value_truncated: bool = False


class LetterEnvelope(BaseModel):
    payload: LetterPayload = Field(default_factory=LetterPayload)


@dataclass(frozen=True)
class Letter:
    dlq_topic: str
    dlq_offset: int
    source_topic: str
    key: str | None
    error: str
    attempts: int
    value: str
    replayable: str | None  # None when it can be redriven, else why not
    event_id: str | None

    @classmethod
    def parse(cls, topic: str, offset: int, raw: bytes) -> Letter:
        p = LetterEnvelope.model_validate_json(raw).payload
        value = p.value
        why, event_id = None, None
        if p.value_truncated:
            why = f"only the first part of the {p.value_bytes} bytes was kept"
        elif p.value_encoding != "utf-8":
            why = "the record was not UTF-8 text"
        else:
            try:
                event_id = str(Envelope.model_validate_json(value, context={"tolerant": True}).event_id)
            except Exception as exc:  # noqa: BLE001  (any parse error means: not an envelope)
                why = f"not a valid envelope: {str(exc).splitlines()[0]}"
        return cls(topic, offset, p.source_topic or topic.removesuffix(DLQ_SUFFIX), p.key, p.error, p.attempts, value,
                   why, event_id)


class Skipped(BaseModel):
    dlq_offset: int
    reason: str


class Redriven(BaseModel):
    """What a redrive did: letters put back on the source topic, and the ones left alone with why."""

    redriven: int
    skipped: list[Skipped]


@dataclass(frozen=True)
class TopicLetters:
    dlq_topic: str
    letters: int
    replayable: int


async def read_letters(bootstrap: str, dlq_topic: str, timeout_s: float = 3.0,
                       options: KafkaClientOptions | None = None) -> list[Letter]:
    from aiokafka import AIOKafkaConsumer  # noqa: PLC0415

    consumer = AIOKafkaConsumer(dlq_topic, bootstrap_servers=bootstrap, group_id=f"whet-dlq-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False, **(options or {}))
    await consumer.start()
    out: list[Letter] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=int(timeout_s * 1000))
            if not batch:
                break
            for records in batch.values():
                out += [Letter.parse(dlq_topic, r.offset, r.value) for r in records if r.value]
    finally:
        await consumer.stop()
    return sorted(out, key=lambda letter: letter.dlq_offset)


async def count_letters(bootstrap: str, dlq_topics: list[str], options: KafkaClientOptions | None = None,
                        idle_ms: int = IDLE_MS) -> list[TopicLetters]:
    """Every listed dead-letter topic's letters, read once from the start by one consumer assigned to all
    their partitions (no consumer group: nothing is committed, nothing waits for a rebalance)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: PLC0415

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_max_wait_ms=min(idle_ms, 100), **(options or {}))
    await consumer.start()
    seen: dict[str, list[Letter]] = {t: [] for t in dlq_topics}
    try:
        partitions = [TopicPartition(t, p) for t in dlq_topics for p in sorted(consumer.partitions_for_topic(t) or {0})]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        while batch := await consumer.getmany(timeout_ms=idle_ms):
            for tp, records in batch.items():
                seen[tp.topic] += [Letter.parse(tp.topic, r.offset, r.value) for r in records if r.value]
    finally:
        await consumer.stop()
    return [TopicLetters(t, len(letters), sum(x.replayable is None for x in letters)) for t, letters in seen.items()]


async def redrive(bootstrap: str, source_topic: str, letters: list[Letter], *, event_id: str | None = None,
                  options: KafkaClientOptions | None = None) -> Redriven:
    """Put the replayable letters back on `source_topic`; the others are skipped with their reason."""
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    chosen = [x for x in letters if event_id in (None, x.event_id)]
    ready = [x for x in chosen if x.replayable is None]
    seen: set[str] = set()
    extra: dict[str, Any] = dict(options or {})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **extra)
    await producer.start()
    try:
        for x in ready:
            if x.event_id in seen:  # the same event dead-lettered twice: once is enough
                continue
            seen.add(x.event_id or "")
            await producer.send_and_wait(source_topic, x.value.encode(), key=x.key.encode() if x.key else None)
    finally:
        await producer.stop()
    return Redriven(redriven=len(seen), skipped=[Skipped(dlq_offset=x.dlq_offset, reason=x.replayable)
                                                 for x in chosen if x.replayable is not None])
