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


# ------------------------------------------------------------------ the events, from Kafka


def _about(env: Mapping[str, Any], job_id: str) -> bool:
    payload = env.get("payload") or {}
    return payload.get("job_id") == job_id or env.get("key") == job_id


async def read_job_events(bootstrap: str, job_id: str, *, since: datetime | None = None,
                          client_options: Mapping[str, Any] | None = None, timeout_s: float = 60) -> list[dict]:
    """The job's events on every topic (DLQs included): [{topic, partition, offset, appended_at, envelope}]."""
    from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: PLC0415

    from whetstone.contracts import all_topic_partitions  # noqa: PLC0415

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                **(client_options or {}))
    await consumer.start()
    seen: list[dict] = []
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
                        seen.append({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                     "appended_at": datetime.fromtimestamp(r.timestamp / 1000, UTC).isoformat(),
                                     "envelope": env})
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        if remaining:
            print(f"warning: stopped reading after {timeout_s:.0f}s; {len(remaining)} partitions not read to the end"
                  " (use --since)", file=sys.stderr)
    finally:
        await consumer.stop()
    traces = {r["envelope"].get("trace_id") for r in seen if _about(r["envelope"], job_id)}
    traces.discard(None)
    return [r for r in seen if _about(r["envelope"], job_id) or r["envelope"].get("trace_id") in traces]


def _envelope(raw: bytes | None) -> dict | None:
    if not raw:
        return None
    try:
        env = json.loads(raw)
    except ValueError:
        return None
    return env if isinstance(env, dict) and env.get("event_id") else None


# ------------------------------------------------------------------ the deliveries, from the services


async def fetch_deliveries(urls: Mapping[str, str], job_id: str, trace_ids: Iterable[str | None], secret: bytes,
                           timeout_s: float = 10) -> tuple[list[dict], dict[str, str]]:
    """Every service's deliveries of the job's events, and the services that did not answer (why)."""
    import httpx  # noqa: PLC0415

    from whetstone.runtime.identity import internal_headers  # noqa: PLC0415

    queries = [{"job_id": job_id, **({"trace_id": t} if t else {})} for t in (sorted({t for t in trace_ids if t})
                                                                              or [None])]
    rows: dict[tuple[str, str], dict] = {}
    failed: dict[str, str] = {}

    async def one(c: Any, name: str, url: str) -> None:
        for params in queries:
            try:
                r = await c.get(url + "/internal/trace", params=params, headers=internal_headers(secret))
            except httpx.HTTPError as exc:
                failed[name] = f"unreachable at {url} ({type(exc).__name__})"
                return
            if r.status_code != 200:
                failed[name] = f"{r.status_code} {r.text[:200]}"
                return
            for d in r.json().get("data", []):
                rows[(d["consumer"], d["event_id"])] = {**d, "service": name}

    async with httpx.AsyncClient(timeout=timeout_s) as c:
        await asyncio.gather(*(one(c, n, u) for n, u in urls.items()))
    return list(rows.values()), failed


# ------------------------------------------------------------------ the join


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def build_trace(events: list[dict], deliveries: list[dict]) -> list[dict]:
    """One entry per event, in production order, each with its consumers in consumption order."""
    by_event: dict[str, dict] = {}
    for rec in events:
        env = rec["envelope"]
        eid = str(env["event_id"])
        if eid in by_event:   # the same event on the topic twice (a redelivered publish): the first copy
            by_event[eid]["copies"] += 1
            continue
        by_event[eid] = {"event_id": eid, "event_type": env.get("event_type"), "topic": rec["topic"],
                         "partition": rec["partition"], "offset": rec["offset"], "producer": env.get("producer"),
                         "produced_at": env.get("occurred_at"), "appended_at": rec["appended_at"],
                         "trace_id": env.get("trace_id"), "tenant_id": env.get("tenant_id"), "copies": 1,
                         "consumers": []}
    for d in deliveries:
        entry = by_event.get(d["event_id"])
        if entry is None:  # consumed, but no longer on the topic (retention) or beyond --since
            entry = by_event[d["event_id"]] = {
                "event_id": d["event_id"], "event_type": d["event_type"], "topic": d["topic"], "partition": None,
                "offset": None, "producer": d["producer"], "produced_at": d["produced_at"], "appended_at": None,
                "trace_id": d["trace_id"], "tenant_id": d["tenant_id"], "copies": 0, "consumers": []}
        entry["consumers"].append({k: d[k] for k in ("service", "consumer", "consumed_at", "handled_at", "lag_s",
                                                      "handler_s", "outcome")})
    out = sorted(by_event.values(), key=lambda e: (_ts(e["produced_at"]) or _ts(e["appended_at"]) or 0.0,
                                                   e["offset"] or 0))
    for e in out:
        e["consumers"].sort(key=lambda c: _ts(c["consumed_at"]) or 0.0)
        e["publish_delay_s"] = (round(_ts(e["appended_at"]) - _ts(e["produced_at"]), 6)
                                if e["appended_at"] and e["produced_at"] else None)
    return out


def render(job_id: str, trace: list[dict], failed: Mapping[str, str]) -> str:
    if not trace:
        return f"no events found for {job_id}"
    t0 = min(_ts(e["produced_at"]) or _ts(e["appended_at"]) or 0.0 for e in trace)
    traces = sorted({e["trace_id"] for e in trace if e["trace_id"]})
    lines = [f"trace of {job_id}  ({len(trace)} events; trace id {', '.join(traces) or '-'})",
             f"{'t+':>9}  {'event':<24} {'producer':<14} {'topic/partition@offset':<30} consumers"]
    for e in trace:
        at = _ts(e["produced_at"]) or _ts(e["appended_at"]) or t0
        where = f"{e['topic']}/{e['partition']}@{e['offset']}" if e["offset"] is not None else f"{e['topic']} @?*"
        head = f"{at - t0:>8.3f}s  {e['event_type'] or '?':<24} {e['producer'] or '?':<14} {where:<30}"
        if not e["consumers"]:
            lines.append(head + " (no consumer recorded)")
            continue
        for i, c in enumerate(e["consumers"]):
            text = (f"-> {c['service']:<13} lag {c['lag_s']:.3f}s  handler {c['handler_s'] * 1000:.1f}ms"
                    f"  {c['outcome']}" if c["lag_s"] is not None else f"-> {c['service']} {c['outcome']}")
            lines.append((head if i == 0 else " " * len(head)) + " " + text)
    slowest = max((c for e in trace for c in e["consumers"] if c["lag_s"] is not None),
                  key=lambda c: c["lag_s"] + c["handler_s"], default=None)
    if slowest is not None:
        lines.append(f"longest hop: {slowest['service']} (lag {slowest['lag_s']:.3f}s + handler "
                     f"{slowest['handler_s'] * 1000:.1f}ms)")
    unplaced = sum(e["offset"] is None for e in trace)
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
                    ) -> tuple[list[dict], dict[str, str]]:
    events = await read_job_events(bootstrap, job_id, since=since, client_options=client_options)
    trace_ids = {r["envelope"].get("trace_id") for r in events}
    deliveries, failed = await fetch_deliveries(urls, job_id, trace_ids, secret)
    for attempt in range(REREADS):
        on_topics = {str(r["envelope"]["event_id"]) for r in events}
        if all(d["event_id"] in on_topics for d in deliveries):
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
    from whetstone.runtime.service import load_stack_env  # noqa: PLC0415
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
        print(json.dumps({"job_id": args.job_id, "events": trace, "unanswered": failed}, indent=1))
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
