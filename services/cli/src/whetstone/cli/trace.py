"""`whet jobs trace JOB`: every event about one job across the topics, in time order, with who
produced it and when, which services consumed it, their consumer lag (consumed - produced) and
handler latency: the one place to see where a job spent its time.

The services talk only through Kafka, so the trace is put together the same way, never from another
service's database:
1. the job's events are read from the Kafka topics (every partition, from the start or `--since`):
   those whose payload names the job, plus every event carrying their trace id;
2. each service answers `GET /internal/trace?job_id=…&trace_id=…` with its own deliveries of them
   (its `handled` rows; the call is signed with the platform's internal secret);
3. the two are joined by event id. An event no service consumed, or a delivery whose event has left
   the topics (retention), is still listed.

Service URLs: `--service NAME=URL` (repeatable), else WHETSTONE_<SVC>_URL, else the ports `whet dev`
wrote to <data_dir>/services.json, else 127.0.0.1 and the service's default port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

DEFAULT_PORTS = {"scheduler": 8100, "ingest": 8101, "trainer-agent": 8102, "eval": 8103, "registry": 8104,
                 "metering": 8105, "serving": 8107}
SKIPPED_TOPICS = ("node.heartbeat",)  # about nodes, never one job; the busiest topic
SERVICES_FILE = "services.json"
REREADS = 4  # reads of the topics after the first while a delivery names an event not seen on them


# ------------------------------------------------------------------ where the services are


def service_urls(overrides: Iterable[str] = (), data_dir: Path | None = None,
                 env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    urls = {name: f"http://127.0.0.1:{env.get(f'WHETSTONE_{_env(name)}_HTTP_PORT', port)}"
            for name, port in DEFAULT_PORTS.items()}
    if data_dir is not None and (data_dir / SERVICES_FILE).is_file():
        try:
            urls.update(json.loads((data_dir / SERVICES_FILE).read_text()))
        except (OSError, ValueError):
            pass
    for name in DEFAULT_PORTS:
        if env.get(f"WHETSTONE_{_env(name)}_URL"):
            urls[name] = env[f"WHETSTONE_{_env(name)}_URL"]
    for item in overrides:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise SystemExit(f"--service {item!r}: expected NAME=http://host:port")
        urls[name] = url
    return {k: v.rstrip("/") for k, v in urls.items()}


def _env(name: str) -> str:
    return name.upper().replace("-", "_")


def write_services_file(data_dir: Path, upstreams: Mapping[str, str]) -> Path:
    """`whet dev` leaves its services' URLs here for `whet jobs trace`."""
    path = data_dir / SERVICES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(upstreams), indent=1))
    return path


# ------------------------------------------------------------------ what the trace reads


class PayloadRef(BaseModel):
    """The one field of an event's payload the trace reads."""

    job_id: str | None = None


class EnvelopeRef(BaseModel):
    """What the trace reads of an envelope found on a topic."""

    event_id: str
    event_type: str | None = None
    producer: str | None = None
    occurred_at: str | None = None
    trace_id: str | None = None
    tenant_id: str | None = None
    key: str | None = None
    payload: PayloadRef | None = None

    def about(self, job_id: str) -> bool:
        return (self.payload is not None and self.payload.job_id == job_id) or self.key == job_id


class TopicRecord(BaseModel):
    """An event as it sits on its topic."""

    topic: str
    partition: int
    offset: int
    appended_at: str
    envelope: EnvelopeRef


class Delivery(BaseModel):
    """A service's delivery of an event (one row of its `GET /internal/trace`)."""

    service: str = ""
    consumer: str
    event_id: str
    event_type: str | None = None
    topic: str | None = None
    producer: str | None = None
    produced_at: str | None = None
    trace_id: str | None = None
    tenant_id: str | None = None
    consumed_at: str | None = None
    handled_at: str | None = None
    lag_s: float | None = None
    handler_s: float = 0.0
    outcome: str | None = None


class TraceAnswer(BaseModel):
    data: list[Delivery] = []


class Consumer(BaseModel):
    service: str
    consumer: str
    consumed_at: str | None
    handled_at: str | None
    lag_s: float | None
    handler_s: float
    outcome: str | None


class TraceEvent(BaseModel):
    """One event of the trace, with its consumers in consumption order."""

    event_id: str
    event_type: str | None
    topic: str | None
    partition: int | None
    offset: int | None
    producer: str | None
    produced_at: str | None
    appended_at: str | None
    trace_id: str | None
    tenant_id: str | None
    copies: int
    consumers: list[Consumer] = []
    publish_delay_s: float | None = None

    @property
    def at(self) -> float | None:
        return _ts(self.produced_at) or _ts(self.appended_at)


# ------------------------------------------------------------------ the events, from Kafka


async def read_job_events(bootstrap: str, job_id: str, *, since: datetime | None = None,
                          client_options: Mapping[str, Any] | None = None,
                          timeout_s: float = 60) -> list[TopicRecord]:
    """The job's events on every topic (DLQs included)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: PLC0415

    from whetstone.contracts import all_topic_partitions  # noqa: PLC0415

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                **(client_options or {}))
    await consumer.start()
    seen: list[TopicRecord] = []
    try:
        existing = await consumer.topics()
        parts = [TopicPartition(t, p) for t, n in all_topic_partitions() if t in existing and t not in SKIPPED_TOPICS
                 for p in (consumer.partitions_for_topic(t) or range(n))]
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        if since is not None:
            starts = await consumer.offsets_for_times({tp: int(since.timestamp() * 1000) for tp in parts})
            for tp in parts:
                found = starts.get(tp)
                consumer.seek(tp, found.offset if found is not None else ends[tp])
        else:
            await consumer.seek_to_beginning(*parts)
        remaining = {tp for tp in parts if ends[tp] > 0}
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            batch = await consumer.getmany(*remaining, timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                for r in records:
                    env = _envelope(r.value)
                    if env is not None:
                        seen.append(TopicRecord(topic=r.topic, partition=r.partition, offset=r.offset,
                                                appended_at=datetime.fromtimestamp(r.timestamp / 1000, UTC).isoformat(),
                                                envelope=env))
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        if remaining:
            print(f"warning: stopped reading after {timeout_s:.0f}s; {len(remaining)} partitions not read to the end"
                  " (use --since)", file=sys.stderr)
    finally:
        await consumer.stop()
    traces = {r.envelope.trace_id for r in seen if r.envelope.about(job_id)}
    traces.discard(None)
    return [r for r in seen if r.envelope.about(job_id) or r.envelope.trace_id in traces]


def _envelope(raw: bytes | None) -> EnvelopeRef | None:
    """The envelope of a record, or None for a record that is not one (no event id, not JSON)."""
    if not raw:
        return None
    try:
        env = EnvelopeRef.model_validate_json(raw)
    except ValidationError:
        return None
    return env if env.event_id else None


# ------------------------------------------------------------------ the deliveries, from the services


async def fetch_deliveries(urls: Mapping[str, str], job_id: str, trace_ids: Iterable[str | None], secret: bytes,
                           timeout_s: float = 10) -> tuple[list[Delivery], dict[str, str]]:
    """Every service's deliveries of the job's events, and the services that did not answer (why)."""
    import httpx  # noqa: PLC0415

    from whetstone.runtime.identity import InternalAuth  # noqa: PLC0415

    queries = [{"job_id": job_id, **({"trace_id": t} if t else {})} for t in (sorted({t for t in trace_ids if t})
                                                                              or [None])]
    rows: dict[tuple[str, str], Delivery] = {}
    failed: dict[str, str] = {}

    async def one(c: httpx.AsyncClient, name: str, url: str) -> None:
        for params in queries:
            try:
                r = await c.get(url + "/internal/trace", params=params, auth=InternalAuth(secret))
            except httpx.HTTPError as exc:
                failed[name] = f"unreachable at {url} ({type(exc).__name__})"
                return
            if r.status_code != 200:
                failed[name] = f"{r.status_code} {r.text[:200]}"
                return
            for d in TraceAnswer.model_validate_json(r.content).data:
                rows[(d.consumer, d.event_id)] = d.model_copy(update={"service": name})

    async with httpx.AsyncClient(timeout=timeout_s) as c:
        await asyncio.gather(*(one(c, n, u) for n, u in urls.items()))
    return list(rows.values()), failed


# ------------------------------------------------------------------ the join


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def build_trace(events: list[TopicRecord], deliveries: list[Delivery]) -> list[TraceEvent]:
    """One entry per event, in production order, each with its consumers in consumption order."""
    by_event: dict[str, TraceEvent] = {}
    for rec in events:
        env = rec.envelope
        if env.event_id in by_event:   # the same event on the topic twice (a redelivered publish): the first copy
            by_event[env.event_id].copies += 1
            continue
        by_event[env.event_id] = TraceEvent(
            event_id=env.event_id, event_type=env.event_type, topic=rec.topic, partition=rec.partition,
            offset=rec.offset, producer=env.producer, produced_at=env.occurred_at, appended_at=rec.appended_at,
            trace_id=env.trace_id, tenant_id=env.tenant_id, copies=1)
    for d in deliveries:
        entry = by_event.get(d.event_id)
        if entry is None:  # consumed, but no longer on the topic (retention) or beyond --since
            entry = by_event[d.event_id] = TraceEvent(
                event_id=d.event_id, event_type=d.event_type, topic=d.topic, partition=None, offset=None,
                producer=d.producer, produced_at=d.produced_at, appended_at=None, trace_id=d.trace_id,
                tenant_id=d.tenant_id, copies=0)
        entry.consumers.append(Consumer(service=d.service, consumer=d.consumer, consumed_at=d.consumed_at,
                                        handled_at=d.handled_at, lag_s=d.lag_s, handler_s=d.handler_s,
                                        outcome=d.outcome))
    out = sorted(by_event.values(), key=lambda e: (e.at or 0.0, e.offset or 0))
    for e in out:
        e.consumers.sort(key=lambda c: _ts(c.consumed_at) or 0.0)
        appended, produced = _ts(e.appended_at), _ts(e.produced_at)
        e.publish_delay_s = round(appended - produced, 6) if appended is not None and produced is not None else None
    return out


def render(job_id: str, trace: list[TraceEvent], failed: Mapping[str, str]) -> str:
    if not trace:
        return f"no events found for {job_id}"
    t0 = min(e.at or 0.0 for e in trace)
    traces = sorted({e.trace_id for e in trace if e.trace_id})
    lines = [f"trace of {job_id}  ({len(trace)} events; trace id {', '.join(traces) or '-'})",
             f"{'t+':>9}  {'event':<24} {'producer':<14} {'topic/partition@offset':<30} consumers"]
    for e in trace:
        at = e.at or t0
        where = f"{e.topic}/{e.partition}@{e.offset}" if e.offset is not None else f"{e.topic} @?*"
        head = f"{at - t0:>8.3f}s  {e.event_type or '?':<24} {e.producer or '?':<14} {where:<30}"
        if not e.consumers:
            lines.append(head + " (no consumer recorded)")
            continue
        for i, c in enumerate(e.consumers):
            text = (f"-> {c.service:<13} lag {c.lag_s:.3f}s  handler {c.handler_s * 1000:.1f}ms"
                    f"  {c.outcome}" if c.lag_s is not None else f"-> {c.service} {c.outcome}")
            lines.append((head if i == 0 else " " * len(head)) + " " + text)
    slowest = max(((c, c.lag_s) for e in trace for c in e.consumers if c.lag_s is not None),
                  key=lambda pair: pair[1] + pair[0].handler_s, default=None)
    if slowest is not None:
        hop, lag = slowest
        lines.append(f"longest hop: {hop.service} (lag {lag:.3f}s + handler {hop.handler_s * 1000:.1f}ms)")
    unplaced = sum(e.offset is None for e in trace)
    if unplaced:
        lines.append(f"* {unplaced} event(s) without a place (@?): a service recorded consuming them, but they were "
                     "not on their topic when it was read: the broker no longer keeps them (topic retention), they "
                     "precede --since, or they were appended after the read (run the trace again to see them placed)")
    for name, why in sorted(failed.items()):
        lines.append(f"note: {name} did not answer: {why}")
    return "\n".join(lines)


# ------------------------------------------------------------------ the command


async def trace_job(job_id: str, *, urls: Mapping[str, str], bootstrap: str, secret: bytes,
                    since: datetime | None = None, client_options: Mapping[str, Any] | None = None,
                    ) -> tuple[list[TraceEvent], dict[str, str]]:
    events = await read_job_events(bootstrap, job_id, since=since, client_options=client_options)
    trace_ids = {r.envelope.trace_id for r in events}
    deliveries, failed = await fetch_deliveries(urls, job_id, trace_ids, secret)
    for attempt in range(REREADS):
        on_topics = {r.envelope.event_id for r in events}
        if all(d.event_id in on_topics for d in deliveries):
            break
        # consumed already, but appended after the topics were read (a job's last events race the trace), or
        # not yet in the broker's answer to "where does each partition end": read the topics again (a few
        # times, a second apart), so only events really gone from them (retention, --since) lack an offset
        if attempt:
            await asyncio.sleep(1.0)
        events = await read_job_events(bootstrap, job_id, since=since, client_options=client_options)
    return build_trace(events, deliveries), failed


def cmd_trace(args: argparse.Namespace) -> int:
    from whetstone.runtime.identity import internal_secret  # noqa: PLC0415
    from whetstone.runtime.settings import load_stack_env  # noqa: PLC0415
    from whetstone.runtime.settings import CommonSettings  # noqa: PLC0415

    load_stack_env(CommonSettings().data_dir)
    settings = CommonSettings()
    if not settings.kafka_bootstrap:
        print("no Kafka configured: set WHETSTONE_KAFKA_BOOTSTRAP (or run `whet stack up`)", file=sys.stderr)
        return 2
    since = datetime.fromtimestamp(time.time() - args.since_hours * 3600, UTC) if args.since_hours else None
    urls = service_urls(args.service, settings.data_dir)
    trace, failed = asyncio.run(trace_job(args.job_id, urls=urls, bootstrap=settings.kafka_bootstrap,
                                          secret=internal_secret(settings.data_dir), since=since,
                                          client_options=settings.kafka_client_options()))
    if args.json:
        print(json.dumps({"job_id": args.job_id, "events": [e.model_dump() for e in trace], "unanswered": failed},
                         indent=1))
    else:
        print(render(args.job_id, trace, failed))
    return 0 if trace else 1


def add_parser(jobs_sub: Any) -> None:
    """`whet jobs trace` (an operator command: needs the internal secret and the broker)."""
    p = jobs_sub.add_parser("trace", help="every event of a job across topics and services, in time order, with "
                                          "consumer lag and handler latency (operators: internal secret)")
    p.add_argument("job_id")
    p.add_argument("--service", action="append", default=[], metavar="NAME=URL",
                   help="a service's internal URL (repeatable; default: whet dev's, else WHETSTONE_<SVC>_URL)")
    p.add_argument("--since-hours", type=float, help="read the topics from this long ago (default: from the start)")
    p.add_argument("--json", action="store_true", help="print the JSON objects instead of text")
    p.set_defaults(fn=cmd_trace)
