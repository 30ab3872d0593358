"""`whet dlq list|show|redrive`: look at dead letters and replay them after a fix (the reading and the
replay live in whetstone.runtime.deadletters, shared with the operator routes).

A redriven letter is the original record, unchanged (same event_id), put back on its source topic:
the consumer handles it through its normal inbox, so replaying a letter twice, or one whose event
was handled since, has no second effect. Letters that cannot be replayed as they are (not a valid
envelope, kept only in part, or not UTF-8) are listed with the reason and left alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from whetstone.contracts import TOPICS
from whetstone.contracts.topics import DLQ_SUFFIX
from whetstone.runtime import deadletters
from whetstone.runtime.deadletters import Letter, read_letters


async def redrive(bootstrap: str, source_topic: str, letters: list[Letter], *, event_id: str | None = None) -> dict:
    """Put the replayable letters back on `source_topic`. Returns counts and the skipped reasons."""
    return (await deadletters.redrive(bootstrap, source_topic, letters, event_id=event_id)).model_dump()


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
