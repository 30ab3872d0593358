"""`whet dlq list|show|redrive`: look at dead letters and replay them after a fix.

A redriven letter is the original record, unchanged (same event_id), put back on its source topic:
the consumer handles it through its normal inbox, so replaying a letter twice, or one whose event
was handled since, has no second effect. Letters that cannot be replayed as they are (not a valid
envelope, kept only in part, or not UTF-8) are listed with the reason and left alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from whetstone.contracts import TOPICS, Envelope
from whetstone.contracts.topics import DLQ_SUFFIX


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


async def read_letters(bootstrap: str, dlq_topic: str, timeout_s: float = 3.0) -> list[Letter]:
    from aiokafka import AIOKafkaConsumer  # noqa: PLC0415

    consumer = AIOKafkaConsumer(dlq_topic, bootstrap_servers=bootstrap, group_id=f"whet-dlq-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
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


async def redrive(bootstrap: str, source_topic: str, letters: list[Letter], *, event_id: str | None = None) -> dict:
    """Put the replayable letters back on `source_topic`. Returns counts and the skipped reasons."""
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    chosen = [x for x in letters if event_id in (None, x.event_id)]
    ready = [x for x in chosen if x.replayable is None]
    seen: set[str] = set()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for x in ready:
            if x.event_id in seen:  # the same event dead-lettered twice: once is enough
                continue
            seen.add(x.event_id or "")
            await producer.send_and_wait(source_topic, x.value.encode(), key=x.key.encode() if x.key else None)
    finally:
        await producer.stop()
    return {"redriven": len(seen), "skipped": [{"dlq_offset": x.dlq_offset, "reason": x.replayable}
                                                for x in chosen if x.replayable is not None]}


def _bootstrap() -> str:
    from whetstone.runtime.settings import resolve_settings  # noqa: PLC0415

    bootstrap = resolve_settings().kafka_bootstrap
    assert bootstrap is not None
    return bootstrap


def _source(topic: str) -> str:
    source = topic.removesuffix(DLQ_SUFFIX)
    if source not in TOPICS:
        raise SystemExit(f"unknown topic {topic!r}; topics: {', '.join(TOPICS)}")
    return source


def cmd_list(args: argparse.Namespace) -> int:
    bootstrap = _bootstrap()

    async def counts() -> dict[str, int]:
        got = await asyncio.gather(*(read_letters(bootstrap, t.dlq, timeout_s=1.0) for t in TOPICS.values()))
        return {t.dlq: len(letters) for t, letters in zip(TOPICS.values(), got, strict=True) if letters}

    result = asyncio.run(counts())
    if args.json:
        print(json.dumps(result))
    else:
        print("no dead letters" if not result else "\n".join(f"{t:32} {n}" for t, n in sorted(result.items())))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    source = _source(args.topic)
    letters = asyncio.run(read_letters(_bootstrap(), TOPICS[source].dlq))[-args.limit:]
    if args.json:
        print(json.dumps([letter.__dict__ for letter in letters]))
        return 0
    for x in letters:
        print(f"#{x.dlq_offset}  key={x.key}  attempts={x.attempts}  event={x.event_id or '-'}")
        print(f"    error: {x.error}")
        print(f"    {'replayable' if x.replayable is None else 'not replayable: ' + x.replayable}")
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    source = _source(args.topic)
    bootstrap = _bootstrap()
    letters = asyncio.run(read_letters(bootstrap, TOPICS[source].dlq))
    result = asyncio.run(redrive(bootstrap, source, letters, event_id=args.event_id))
    print(json.dumps(result) if args.json else
          f"redriven {result['redriven']} letter(s) to {source}; skipped {len(result['skipped'])}")
    return 0


def add_parser(sub: Any) -> None:
    dlq = sub.add_parser("dlq", help="dead letters: list, show, redrive").add_subparsers(dest="action", required=True)
    ls = dlq.add_parser("list", help="dead-letter topics that hold letters, with counts")
    ls.add_argument("--json", action="store_true", help="print the JSON objects instead of text")
    ls.set_defaults(fn=cmd_list)
    show = dlq.add_parser("show", help="the letters of one topic")
    show.add_argument("topic", help="source topic (or its .dlq)")
    show.add_argument("--limit", type=int, default=20, help="at most this many letters (default 20)")
    show.add_argument("--json", action="store_true", help="print the JSON objects instead of text")
    show.set_defaults(fn=cmd_show)
    again = dlq.add_parser("redrive", help="replay a topic's letters through the normal inbox")
    again.add_argument("topic", help="source topic (or its .dlq)")
    again.add_argument("--event-id", help="only this event")
    again.add_argument("--json", action="store_true", help="print the JSON objects instead of text")
    again.set_defaults(fn=cmd_redrive)
