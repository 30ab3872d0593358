"""The one place where a service meets Kafka, Postgres, S3 and HTTP.

A `Service` declares its schema migrations, its subscriptions (topic -> handler),
HTTP routes and background tasks. `run_services` wires and runs one or many of
them in one event loop (`python -m whetstone.<svc>` or `whet dev`).

Delivery (DESIGN.md §3): a message is decoded; an undecodable one is dead-lettered
at once. The handler runs inside a Postgres transaction that also claims the
event_id in the inbox and holds the outbox rows it published; a duplicate is
skipped. A failing handler is retried `max_attempts` times, then the message is
dead-lettered (in a transaction that claims the inbox, so a redelivery does not
dead-letter it twice). The Kafka offsets are committed once per fetch, only after
every message of it committed (consuming.py); if even the dead-lettering fails the
fetch is rewound (NACK). A record whose earlier deliveries never completed (the
process died while handling it) is dead-lettered once it has been handed out
`max_crash_deliveries` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import asyncpg
from aiokafka import AIOKafkaProducer
from fastapi import APIRouter, FastAPI
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaMessage
from structlog.contextvars import bound_contextvars

from whetstone.contracts import TOPICS, Envelope, Event

from . import db, observability
from .delivery import MAX_RECORD_BYTES, PoisonMessage, dead_letter, is_transient, prune_forever
from .assignment import watch_assignment
from .batching import BatchHandler, consume_batch, undecoded
from .consuming import FetchLag, consume_fetch, held_connection
from .identity import identity_keys
from .lifecycle import bounded, freeze_startup_objects, supervise
from .http import BodyLimit, HttpServer, ServiceMetrics, make_app
from .logging import configure_logging, get_logger
from .membership import GroupMember, leave
from .messaging import OutboxRelay, UnitOfWork, current_envelope, decode, parse_payload, unit_of_work
from .s3 import ObjectStore
from .settings import CommonSettings, check_credentials, resolve_settings
from .kafka_security import broker_security
from .topics import ensure_topics, while_unreachable
from .tracing import TraceLog, trace_routes
from .tenancy import claim_and_check


Handler = Callable[["Runtime[Any]", UnitOfWork, Envelope, Any], Awaitable[None]]
Background = Callable[["Runtime[Any]"], Awaitable[None]]

C = TypeVar("C")
STOP_TIMEOUT_S = 30.0  # a service that takes longer to stop is left behind, logged


@dataclass
class Service(Generic[C]):
    name: str
    migrations: Sequence[str] = ()
    subscriptions: dict[str, Handler] = field(default_factory=dict)
    routes: Callable[["Runtime[Any]"], APIRouter] | None = None
    background: Sequence[Background] = ()
    on_start: Callable[["Runtime[Any]"], Awaitable[None]] | None = None
    on_stop: Callable[["Runtime[Any]"], Awaitable[None]] | None = None
    group_id: str | None = None
    http_port: int = 0
    # The service's typed dependencies (config, stores, clients, policies), built once in its
    # bootstrap.py and read by handlers as `rt.ctx`.
    context: C | None = None
    # Optional: consume in batches, one transaction per batch (see batching.py). The per-topic
    # `subscriptions` handlers stay required: a failing batch falls back to them message by message.
    batch_handler: BatchHandler | None = None
    batch_size: int = 500
    batch_concurrency: int = 1  # transactions a batch is split into, by record key, run concurrently
    # The per-message path (no batch_handler) fetches up to `fetch_records` records at a time and commits
    # their offsets once; what is not handled within `fetch_budget_s` goes back for the next fetch.
    fetch_records: int = 100
    fetch_budget_s: float = 5.0
    # Optional: gauges read from the service's own schema by the runtime's metrics collector.
    probes: Sequence[observability.Probe] = ()
    # Optional: the metrics the service derives from the events it publishes (its adapters/metrics.py).
    event_metrics: observability.EventMetrics | None = None
    # Optional: extra options of the Kafka consumer (e.g. session_timeout_ms, group_instance_id).
    consumer_options: dict[str, Any] = field(default_factory=dict)
    # Paths whose routes stream a large body under their own limit (uploads); every other route
    # takes at most `max_body_bytes` (runtime/http.py BodyLimit).
    upload_paths: Sequence[str] = ()
    # Optional: the service's own tables of (table, timestamp column) whose rows guard against a
    # late redelivery, deleted by the runtime's retention when the inbox forgets the same age.
    kept_like_inbox: Sequence[tuple[str, str]] = ()

    @property
    def schema(self) -> str:
        return self.name.replace("-", "_")


def kafka_broker(settings: CommonSettings, client_id: str) -> KafkaBroker:
    """The FastStream broker whose consumers a service subscribes with. Metadata is refreshed every
    `kafka_metadata_max_age_s`: a consumer that joined while the broker could not describe its topics
    holds no partitions until a refresh shows them and it rejoins."""
    if not settings.kafka_bootstrap:
        raise ValueError("no Kafka bootstrap configured (WHETSTONE_KAFKA_BOOTSTRAP)")
    return KafkaBroker(settings.kafka_bootstrap, client_id=client_id, logger=None, security=broker_security(settings),
                       metadata_max_age_ms=int(settings.kafka_metadata_max_age_s * 1000))


class Runtime(Generic[C]):
    """A running service: its pool, broker, outbox relay, store, metrics and HTTP server."""

    def __init__(self, service: Service[C], settings: CommonSettings, *, clock: Callable[[], datetime] | None = None):
        self.service, self.settings = service, settings
        self.name = service.name
        self.consumer = service.group_id or f"whetstone-{service.name}"
        self.clock = clock or (lambda: datetime.now(UTC))
        self.log = get_logger(f"whetstone.{self.name}").bind(service=self.name)
        self.metrics = ServiceMetrics(self.name)
        self.observer = observability.Observer(self.metrics.registry, self.name, settings.tenants,
                                               service.event_metrics)
        self.trace = TraceLog(self.consumer, self.metrics.registry, self.name)  # deliveries, for `whet jobs trace`
        self.pool: asyncpg.Pool | None = None
        self.broker: KafkaBroker | None = None
        self.relay: OutboxRelay | None = None
        self.producer: AIOKafkaProducer | None = None  # the outbox relay's own
        self.http: HttpServer | None = None
        self.store = ObjectStore(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key,
                                 settings.bucket, settings.s3_region)
        self._tasks: list[asyncio.Task[None]] = []
        self.stop_overran: list[str] = []   # the stop's steps that were cut short
        # messages left on each assigned (topic, partition), see `measure_lag`
        self.consumer_lag: dict[tuple[str, int], int] | None = None
        self._subscriber: Any = None
        self.fetch_lag = FetchLag()
        self.in_flight = self.fetch_lag.in_flight  # records fetched, not yet handled, per (topic, partition)

    @property
    def ctx(self) -> C:
        """The service's typed dependencies (see `Service.context`)."""
        if self.service.context is None:
            raise RuntimeError(f"service {self.name} declares no context")
        return self.service.context

    # -- units of work ------------------------------------------------------
    def uow(self) -> contextlib.AbstractAsyncContextManager[UnitOfWork]:
        assert self.pool is not None
        return unit_of_work(self.pool, self.name, self.relay)

    def _message_uow(self) -> contextlib.AbstractAsyncContextManager[UnitOfWork]:
        """A message's unit of work: on the connection its fetch holds (consuming.py) while it is open."""
        assert self.pool is not None
        conn = held_connection.get()
        return unit_of_work(self.pool, self.name, self.relay, conn=None if conn is None or conn.is_closed() else conn)

    # -- lifecycle ----------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        check_credentials(s)
        if not s.database_url:
            raise ValueError("no database configured (WHETSTONE_DATABASE_URL)")
        self.pool = await db.create_pool(s.database_url, self.service.schema)
        applied = await db.migrate(self.pool, self.service.schema, self.service.migrations)
        # the broker may become unreachable after the topics were made (restarting, its storage away)
        await while_unreachable(s, "consumer", self._start_broker)
        await while_unreachable(s, "outbox producer", self._start_producer)
        self.relay = OutboxRelay(self.pool, self._send, batch=1000, max_record_bytes=MAX_RECORD_BYTES,
                                 lock_key=db.lock_key(self.service.schema, "outbox-relay"))
        self.relay.on_committed = self.observer.committed
        self._tasks.append(asyncio.create_task(observability.collector_for(self).run(), name=f"{self.name}-metrics"))
        self._tasks.append(asyncio.create_task(self.relay.run(), name=f"{self.name}-outbox"))
        self._tasks.append(asyncio.create_task(supervise(self, prune_forever), name=f"{self.name}-retention"))
        if self._subscriber is not None:
            self._tasks.append(asyncio.create_task(watch_assignment(self._subscriber, self.name),
                                                   name=f"{self.name}-assignment"))
        self.trace.pool = self.pool
        self._tasks.append(asyncio.create_task(self.trace.run(), name=f"{self.name}-trace"))
        if self.service.on_start:
            await self.service.on_start(self)
        for bg in self.service.background:
            self._tasks.append(asyncio.create_task(supervise(self, bg), name=f"{self.name}-{bg.__name__}"))
        app = make_app(self.name, self.metrics, {"postgres": self._check_db, "kafka": self._check_kafka},
                       docs=s.api_docs)
        # resolved once: identity checks read it per request (only the public key where the deployment gives one)
        app.state.identity_keys = identity_keys(s.data_dir)
        app.include_router(trace_routes(self.name, self.trace))
        if self.service.routes:
            app.include_router(self.service.routes(self))
        self.app: FastAPI = app
        self.http = HttpServer(BodyLimit(app, s.max_body_bytes, self.service.upload_paths), s.http_host,
                               self.service.http_port)
        await self.http.start()
        self.log.info("service started", migrations_applied=applied, http_port=self.http.port,
                      topics=list(self.service.subscriptions))

    async def stop(self) -> None:
        """The runtime's own steps are bounded and one that overran is named (`lifecycle.bounded`); the
        service's on_stop (a trainer's drain: emergency checkpoints) bounds itself, within the
        STOP_TIMEOUT_S that `run_services` gives the whole stop."""
        def step(what: str, aw: Awaitable[Any], timeout_s: float | None, quiet: bool = False) -> Awaitable[bool]:
            return bounded(self.log, self.stop_overran, what, aw, timeout_s, quiet)

        if self.service.on_stop:
            await step("on_stop", self.service.on_stop(self), None)
        for t in self._tasks:
            t.cancel()
        await step("background tasks", asyncio.gather(*self._tasks, return_exceptions=True), 4)
        if self.http:
            await step("http server", self.http.stop(), 4)
        if self.broker:  # stops consuming; the handlers' last commits are in the outbox
            member = GroupMember.of(self._kafka_consumer())
            await step("consumer", self.broker.stop(), 8)
            bootstrap = self.settings.kafka_bootstrap
            if member is not None and not member.left_by_client and bootstrap:  # membership.py: generation 0
                await step("leave group", leave(member, bootstrap,
                                                **self.settings.kafka_client_options()), 2)
        if self.relay and self.pool and self.producer:  # last chance to drain what is committed; the rest waits
            await step("outbox flush", self.relay.flush_once(), 2, quiet=True)
        if self.producer:
            await step("producer", self.producer.stop(), 3)
        await step("trace flush", self.trace.flush(), 2, quiet=True)  # the last deliveries' trace rows
        if self.pool and not await step("database pool", self.pool.close(), 2):
            self.pool.terminate()
        self.log.info("service stopped")

    async def _check_db(self) -> None:
        assert self.pool is not None
        await self.pool.fetchval("SELECT 1")

    async def _check_kafka(self) -> None:
        assert self.broker is not None
        if not await self.broker.ping(timeout=2):
            raise RuntimeError("broker unreachable")

    async def _send(self, topic: str, key: str, value: bytes) -> Awaitable[None]:
        """Hand one record to the producer (in call order) and return the wait for its ack."""
        assert self.producer is not None
        sent = time.perf_counter()
        delivered = await self.producer.send(topic, value, key=key.encode())  # queued in a batch

        async def acknowledged() -> None:
            await delivered  # acknowledged by the broker
            self.metrics.outbox_published.inc()
            self.observer.published(topic, time.perf_counter() - sent)

        return acknowledged()

    async def _start_broker(self) -> None:
        """A new FastStream broker and its subscriber each time: a failed start leaves half-made clients."""
        if self.broker is not None:
            with contextlib.suppress(Exception):  # a broker whose start failed: nothing of it to keep
                await self.broker.stop()
        self.broker = kafka_broker(self.settings, f"whetstone-{self.name}")
        if self.service.subscriptions:
            self._subscribe_all()
        await self.broker.start()

    async def _start_producer(self) -> None:
        # The relay sends straight through aiokafka: many rows per request, no per-message
        # middleware. acks=all: a row is marked sent only once the broker has it durably.
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await self.producer.stop()
        self.producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap, acks="all", linger_ms=2,
                                         client_id=f"whetstone-{self.name}-outbox", max_batch_size=512 * 1024,
                                         **self.settings.kafka_client_options())
        await self.producer.start()

    # -- consumption --------------------------------------------------------
    def _subscribe_all(self) -> None:
        """One consumer (one group member) for all of the service's topics: no rebalance storms. It
        fetches many records at a time: handled in one transaction per batch with a batch handler
        (batching.py), else one transaction per message (consuming.py); offsets committed per fetch."""
        assert self.broker is not None
        routes = {t: (TOPICS[t].model, h) for t, h in self.service.subscriptions.items()}
        batched = self.service.batch_handler is not None
        options = dict(self.service.consumer_options)
        if batched:
            options["max_records"] = self.service.batch_size
        else:  # an idle consumer waits at most this long between polls (FastStream's empty-batch pause)
            options["max_records"] = self.service.fetch_records
            options["batch_timeout_ms"] = min(options.get("fetch_max_wait_ms", 50), 50)
        subscriber = self.broker.subscriber(*routes, group_id=self.consumer, auto_offset_reset="earliest",
                                            ack_policy=AckPolicy.NACK_ON_ERROR, batch=True, decoder=undecoded,
                                            **options)
        self._subscriber = subscriber

        @subscriber  # type: ignore[untyped-decorator]  # FastStream's subscriber call is untyped
        async def consume_many(msg: KafkaMessage) -> None:
            records = msg.raw_message
            taken: dict[tuple[str, int], int] = {}
            for rec in records:
                taken[(rec.topic, rec.partition)] = taken.get((rec.topic, rec.partition), 0) + 1
            for tp, n in taken.items():
                self.in_flight[tp] = self.in_flight.get(tp, 0) + n
            try:
                await self.measure_lag()
                self.fetch_lag.handling = True
                if batched:
                    await consume_batch(self, routes, records)
                else:
                    await consume_fetch(self, routes, records, msg.consumer, taken)
            except Exception:
                self.log.exception("fetch could not be handled nor dead-lettered; will be redelivered",
                                   size=len(records))
                await asyncio.sleep(1.0)
                raise
            finally:
                self.fetch_lag.handling = False
                for tp, n in taken.items():
                    self.in_flight[tp] -= n

    def _kafka_consumer(self) -> Any:
        """The subscriber's aiokafka consumer; None before the subscriber has started one."""
        return getattr(self._subscriber, "consumer", None)

    def assigned_partitions(self) -> tuple[frozenset[tuple[str, int]], dict[str, int]] | None:
        """The (topic, partition) pairs the service's consumer holds now, and the partition count of each
        topic it subscribes to; None while it holds none (not started, or between a rebalance's revoke
        and assign). Asks the consumer's own state: no call to the broker."""
        consumer = self._kafka_consumer()
        if consumer is None:
            return None
        assigned = consumer.assignment()
        if not assigned:
            return None
        counts = {t: len(consumer.partitions_for_topic(t) or ()) for t in consumer.subscription()}
        return frozenset((tp.topic, tp.partition) for tp in assigned), counts

    async def measure_lag(self) -> dict[tuple[str, int], int] | None:
        """Messages not handled yet per assigned partition of the service's consumer: not fetched
        (high watermark of the last fetch minus position) plus fetched but still in a handler.
        -1 for a partition not fetched since it was assigned; None when nothing is assigned
        (not started, or between a rebalance's revoke and assign). Asked of the consumer once per
        fetch: while a fetch is handled, that measurement less what was handled since.
        Bookkeeping: never raises."""
        lag: dict[tuple[str, int], int] | None
        try:
            if self.fetch_lag.handling:
                lag = self.fetch_lag.current()
            else:
                lag = await self.fetch_lag.measure(self._kafka_consumer())
        except Exception as exc:
            self.log.debug("consumer lag unavailable", error=str(exc))
            lag = None
        self.consumer_lag = lag
        return lag

    async def handle_message(self, topic: str, model: type[Event], handler: Handler, raw: bytes,
                             partition: int, offset: int, key: str | None, *,
                             decoded: tuple[Envelope, Event] | None = None, seen: bool | None = None,
                             uncounted: int = 0) -> str:
        """Returns the outcome: handled | duplicate | dead_lettered. By default the record's delivery
        is counted (and the inbox asked) on its own first, `uncounted` earlier deliveries added; with
        `seen` given, its fetch was counted and the inbox asked for the whole fetch (consuming.py)
        and this is the fetch's first delivery. `decoded`: the envelope and event already parsed."""
        start, began = time.perf_counter(), time.time()
        where = f"{topic}/{partition}/{offset}"
        if decoded is not None:
            env, event = decoded
        elif raw is None:  # a tombstone: no envelope, no event; nothing to do but say so
            await self._dead_letter(topic, where, partition, offset, key, b"", 1,
                                    "tombstone: a record with a null value carries no event", tenant_id="unknown",
                                    trace_id=None)
            self.metrics.refused(reason="tombstone").inc()
            return "dead_lettered"
        else:
            try:
                env = decode(raw)
                event = parse_payload(env, model)
            except Exception as exc:
                await self._dead_letter(topic, where, partition, offset, key, raw, 1,
                                        f"malformed message: {exc}", tenant_id="unknown", trace_id=None)
                self.metrics.refused(reason="malformed").inc()
                return "dead_lettered"
        message_id = str(env.event_id)
        assert self.pool is not None
        if seen is None:
            seen, deliveries = await db.check_delivery(self.pool, self.consumer, message_id, topic, partition, offset)
            deliveries += uncounted if not seen else 0
        else:
            deliveries = 1
        if seen:
            self.metrics.consumed(topic=topic, outcome="duplicate").inc()
            return "duplicate"
        if deliveries > self.settings.max_crash_deliveries:  # handed out before, and the process never finished it
            await self._dead_letter(topic, f"dlq:{message_id}", partition, offset, key, raw, deliveries,
                                    f"delivered {deliveries} times without completing (the consumer crashed or was"
                                    " killed while handling it)", tenant_id=env.tenant_id, trace_id=env.trace_id)
            self.metrics.refused(reason="crash_loop").inc()
            self.trace.record(topic, env, event, began, time.perf_counter() - start, "dead_lettered")
            return "dead_lettered"
        ids = {"event_id": message_id, "tenant_id": env.tenant_id, "trace_id": env.trace_id, "topic": topic}
        if hasattr(event, "job_id"):
            ids["job_id"] = event.job_id
        last_error = ""
        attempts = self.settings.max_attempts
        with bound_contextvars(**ids):
            token = current_envelope.set(env)
            try:
                attempt, outage_since = 0, None
                while attempt < attempts:
                    attempt += 1
                    try:
                        async with self._message_uow() as uow:
                            if not await claim_and_check(uow.conn, self.consumer, message_id, topic, env, event):
                                self.metrics.consumed(topic=topic, outcome="duplicate").inc()
                                return "duplicate"
                            await handler(self, uow, env, event)
                        elapsed = time.perf_counter() - start
                        self.metrics.consumed(topic=topic, outcome="handled").inc()
                        self.metrics.handler_seconds(topic=topic).observe(elapsed)
                        self.trace.record(topic, env, event, began, elapsed, "handled")
                        return "handled"
                    except PoisonMessage as exc:
                        last_error, attempts = f"rejected ({exc.reason}): {exc}", attempt
                        self.metrics.refused(reason=exc.reason).inc()
                        break
                    except Exception as exc:
                        last_error = f"{type(exc).__name__}: {exc}"
                        if is_transient(exc):  # a dependency is down, not this message's fault: wait for it
                            outage_since = outage_since or time.monotonic()
                            waited = time.monotonic() - outage_since
                            if waited < self.settings.transient_retry_s:
                                self.log.warning("dependency unavailable; retrying", error=last_error,
                                                 waited_s=round(waited, 1))
                                attempt -= 1  # does not count against the message
                                await asyncio.sleep(min(0.5 * 2 ** min(int(waited) // 5, 5), 10.0))
                                continue
                        self.log.warning("handler failed", attempt=attempt, of=attempts, error=last_error)
                        if attempt < attempts:
                            await asyncio.sleep(0.1 * 2 ** attempt)
                # claimed as dlq:<event_id>: the event itself stays unclaimed, so a redrive after a
                # fix goes through the normal inbox once (`whet dlq redrive`)
                await self._dead_letter(topic, f"dlq:{message_id}", partition, offset, key, raw, attempts, last_error,
                                        tenant_id=env.tenant_id, trace_id=env.trace_id)
                self.trace.record(topic, env, event, began, time.perf_counter() - start, "dead_lettered")
                return "dead_lettered"
            finally:
                current_envelope.reset(token)

    async def _dead_letter(self, topic: str, message_id: str, partition: int, offset: int, key: str | None,
                           raw: bytes, attempts: int, error: str, *, tenant_id: str, trace_id: str | None) -> None:
        letter = dead_letter(topic, partition, offset, self.name, attempts, error, key, raw)
        async with self.uow() as uow:
            if not await db.claim_inbox(uow.conn, self.consumer, message_id, topic):
                return
            env = await uow.publish(letter, tenant_id=tenant_id, trace_id=trace_id, topic=TOPICS[topic].dlq,
                                    key=(key or message_id)[:1000])
        self.metrics.dead_lettered(topic=topic).inc()
        self.metrics.consumed(topic=topic, outcome="dead_lettered").inc()
        self.log.error("message dead-lettered", dlq=TOPICS[topic].dlq, error=error, attempts=attempts,
                       dlq_event_id=str(env.event_id))


async def run_services(services: Sequence[Service[Any]], settings: CommonSettings | None = None,
                       ready: Callable[[list[Runtime[Any]]], None] | None = None,
                       stop_event: asyncio.Event | None = None, handle_signals: bool = True) -> None:
    """Start the services in one loop, run until SIGINT/SIGTERM (or stop_event), stop cleanly.
    `handle_signals=False` (tests running services inside their own process) leaves SIGINT/SIGTERM
    alone, so a hung test can still be interrupted; the handlers are removed again on the way out."""
    settings = settings or resolve_settings()
    configure_logging(settings.log_level, settings.log_json)
    await ensure_topics(settings)
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    stop_event = stop_event or asyncio.Event()
    if handle_signals:  # SIGINT/SIGTERM stop the services cleanly
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop_event.set)
                handled.append(sig)
            except (NotImplementedError, RuntimeError):
                pass
    runtimes = [Runtime(s, settings) for s in services]
    started: list[Runtime[Any]] = []
    try:
        for rt in runtimes:
            await rt.start()
            started.append(rt)
        if ready:
            ready(runtimes)
        await stop_event.wait()
    finally:
        for rt in reversed(started):
            try:
                await asyncio.wait_for(rt.stop(), timeout=STOP_TIMEOUT_S)
            except TimeoutError:
                rt.log.error("service did not stop in time; leaving it", timeout_s=STOP_TIMEOUT_S)
        for sig in handled:  # give the signals back: a later hang must still be interruptible
            loop.remove_signal_handler(sig)


def service_main(*builders: Callable[[], Service[Any]]) -> None:
    """Console-script entry point: run the given service(s) until SIGINT/SIGTERM (the process's
    start-up objects frozen out of the cyclic collector once they are up)."""
    asyncio.run(run_services([b() for b in builders], ready=lambda _runtimes: freeze_startup_objects()))
