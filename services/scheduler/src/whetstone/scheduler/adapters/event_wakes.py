"""Wake the jobs' event streams when a job's events change, so no stream asks Postgres on a timer.

`JobStore` NOTIFYs `EVENTS_CHANNEL` with the job id in every transaction that writes a job event or
ends a job (Postgres delivers it when the transaction commits, to every scheduler replica). One
connection per process LISTENs, opened with the first stream and kept outside the pool (the pool
stays whole for requests), and sets the asyncio events of the streams that follow that job. A
stream still looks every `fallback_s` on its own: a notification lost with a dropped listening
connection delays its events by that much, never loses them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

EVENTS_CHANNEL = "scheduler_job_events"


class EventWakes:
    def __init__(self, dsn: str, fallback_s: float = 5.0) -> None:
        self.dsn, self.fallback_s = dsn, fallback_s
        self.waiters: dict[str, set[asyncio.Event]] = {}
        self._conn: asyncpg.Connection | None = None
        self._opening: asyncio.Lock | None = None

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for event in self.waiters.get(payload, ()):
            event.set()

    def _lost(self, _conn: Any) -> None:
        self._conn = None   # the next stream (or wait) opens a new one; streams meanwhile fall back
        for events in self.waiters.values():
            for event in events:
                event.set()

    async def _listen(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            return
        self._opening = self._opening or asyncio.Lock()
        async with self._opening:
            if self._conn is not None and not self._conn.is_closed():
                return
            conn = await asyncpg.connect(self.dsn)
            conn.add_termination_listener(self._lost)
            await conn.add_listener(EVENTS_CHANNEL, self._notified)
            self._conn = conn

    @contextlib.asynccontextmanager
    async def watch(self, job_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set when `job_id`'s events change; the holder clears it before each look."""
        event = asyncio.Event()
        self.waiters.setdefault(job_id, set()).add(event)
        try:
            try:
                await self._listen()
            except (OSError, asyncpg.PostgresError):
                pass   # no listener now: the stream falls back to looking every fallback_s
            yield event
        finally:
            followers = self.waiters.get(job_id)
            if followers is not None:
                followers.discard(event)
                if not followers:
                    del self.waiters[job_id]

    async def wait(self, event: asyncio.Event) -> None:
        """Until `event` is set or `fallback_s` passed (listening again first if the connection was lost)."""
        if self._conn is None:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await self._listen()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), self.fallback_s)

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
