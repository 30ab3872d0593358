"""Continuous batching on the engine's one worker thread: between two decode steps the queue is
drained, new requests are prefilled and join the running batch (up to `max_batch` rows), and a
finished row leaves at once. When idle, the first request waits `window_ms` for company. Mixed
mode batches any adapters together; the baseline mode admits only requests for the running
batch's adapter (one adapter per forward pass). Adapter loads/unloads run on the same thread
between steps, so weights never change under a running forward pass. What the rows emit during a
step is handed to the event loop in one call after the step (`post`), not one wake-up per token."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .engine import GenRow, LoraEngine, RunningBatch


@dataclass
class _Op:
    fn: Callable[[], Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


_STOP = object()


def _call_all(calls: list[tuple[Callable[..., None], tuple]]) -> None:
    for fn, args in calls:
        fn(*args)


class Batcher:
    def __init__(self, engine: LoraEngine, *, window_ms: float, max_batch: int, mixed: bool) -> None:
        self.engine, self.window_s, self.max_batch, self.mixed = engine, window_ms / 1000, max_batch, mixed
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: deque[GenRow] = deque()
        self._thread: threading.Thread | None = None
        self.running = RunningBatch(engine)
        self.steps = 0      # forward passes (prefills and decode steps)
        self.step_rows = 0  # rows over all forward passes: step_rows / steps = mean batch rows
        self._posted: dict[asyncio.AbstractEventLoop, list[tuple[Callable[..., None], tuple]]] = {}

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="serving-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, row: GenRow) -> None:
        self._queue.put(row)

    def post(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
        """From the worker thread (a row's `emit`): call `fn(*args)` on `loop` once this step is over."""
        self._posted.setdefault(loop, []).append((fn, args))

    def _hand_over(self) -> None:
        posted, self._posted = self._posted, {}
        for loop, calls in posted.items():
            try:
                loop.call_soon_threadsafe(_call_all, calls)
            except RuntimeError:  # that event loop is closed: nobody is waiting for these rows
                pass

    async def run_op(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the worker thread between decode steps; its result or exception comes back here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Op(fn, future, loop))
        return await future

    # -- worker thread ------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._hand_over()

    def _loop(self) -> None:
        running = self.running
        while True:
            self._hand_over()
            if not self._drain(block=not self._pending and not running.rows, timeout=None):
                running.fail("the server is shutting down")
                return
            if not running.rows and self._pending:
                while len(self._pending) < self.max_batch:  # idle: the first request waits for company
                    left = self._pending[0].arrived + self.window_s - time.monotonic()
                    if left <= 0:
                        break
                    if not self._drain(block=True, timeout=left):
                        return
            orphans = running.orphans()
            if orphans:  # never served from other weights (the pool pins adapters in use: a safety net)
                running.fail("the adapter was unloaded while generating", only=orphans)
            newcomers = self._take(room=self.max_batch - len(running.rows))
            gone = [r for r in newcomers if self.engine.slot_of(r.adapter) is None]
            for row in gone:  # never served from other weights: the adapter was unloaded meanwhile
                row.emit(f"adapter {row.adapter} is no longer loaded", "error")
            newcomers = [r for r in newcomers if self.engine.slot_of(r.adapter) is not None]
            try:
                if newcomers:
                    self._count(len(newcomers))
                    running.admit(newcomers, mixed=self.mixed)
                    self._hand_over()  # first tokens out before the next step
            except Exception as exc:  # noqa: BLE001  a bad request fails its own rows, never the thread
                for row in newcomers:
                    if row.completion_tokens == 0:
                        row.emit(f"{type(exc).__name__}: {exc}", "error")
            try:
                if running.rows:
                    self._count(len(running.rows))
                    running.step()
            except Exception as exc:  # noqa: BLE001  a failed step fails the running rows, never the thread
                running.fail(f"{type(exc).__name__}: {exc}")

    def _count(self, rows: int) -> None:
        self.steps += 1
        self.step_rows += rows

    def _drain(self, *, block: bool, timeout: float | None) -> bool:
        """Move queued rows to pending and run ops; False once stopped."""
        try:
            item = self._queue.get(block=block, timeout=timeout) if block else self._queue.get_nowait()
        except queue.Empty:
            return True
        while True:
            if item is _STOP:
                for row in self._pending:
                    row.emit("the server is shutting down", "error")
                return False
            if isinstance(item, _Op):
                self._run_op(item)
            else:
                self._pending.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True

    @staticmethod
    def _run_op(op: _Op) -> None:
        try:
            result, error = op.fn(), None
        except BaseException as exc:  # noqa: BLE001  handed back to the awaiting coroutine
            result, error = None, exc

        def settle() -> None:
            if op.future.cancelled():
                return
            if error is not None:
                op.future.set_exception(error)
            else:
                op.future.set_result(result)

        op.loop.call_soon_threadsafe(settle)

    def _take(self, room: int) -> list[GenRow]:
        """Pending rows that may join the running batch now (oldest first)."""
        if room <= 0 or not self._pending:
            return []
        if self.mixed:
            return [self._pending.popleft() for _ in range(min(room, len(self._pending)))]
        running = self.running.adapters
        adapter = next(iter(running)) if running else self._pending[0].adapter
        batch, rest = [], deque()
        while self._pending:
            row = self._pending.popleft()
            (batch if row.adapter == adapter and len(batch) < room else rest).append(row)
        self._pending = rest
        return batch
