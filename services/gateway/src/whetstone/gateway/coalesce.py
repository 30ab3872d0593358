"""Identical reads of one API key that wait at the edge together share one upstream call.

A GET without a body (not a stream) of one key, for one request target and `Accept`, that finds
another such read still waiting for its place (fairness.py) joins it: when the first one goes in,
no later read joins any more, and every read that joined gets the answer of that one call. Each
of them arrived before the call was made, so the answer reflects a moment inside each request's
own lifetime, as if it had been sent alone (a write a caller finished before its read is seen).
A flood of identical polls (many threads of one client asking for the same job list) thus costs
the service one call per turn, not one per request. Only small, complete answers below 500 are
shared; otherwise, or when the first read is refused at the edge, each joined read goes on alone.
Reads that differ (another page, another key) are not joined: the fairness rules alone share the
service between them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Send = Callable[[dict[str, Any]], Awaitable[None]]
MAX_SHARED_BYTES = 1 << 20


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class ReadGroup:
    """The reads waiting on one leader's upstream call."""

    answer: asyncio.Future[Answer | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    followers: int = 0

    def finish(self, answer: Answer | None) -> None:
        if not self.answer.done():
            self.answer.set_result(answer)


@dataclass
class Capture:
    """The leader's answer as it is sent, kept while it stays small enough to share."""

    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    complete: bool = False
    shareable: bool = True

    def wrap(self, send: Send, limit: int = MAX_SHARED_BYTES) -> Send:
        async def capturing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status, self.headers = message["status"], list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                self.size += len(body)
                if self.size > limit:
                    self.shareable, self.chunks = False, []
                elif self.shareable and body:
                    self.chunks.append(body)
                self.complete = not message.get("more_body", False)
            await send(message)
        return capturing

    def answer(self) -> Answer | None:
        if self.status is None or self.status >= 500 or not self.complete or not self.shareable:
            return None
        return Answer(self.status, self.headers, b"".join(self.chunks))


class Coalescer:
    def __init__(self) -> None:
        self.forming: dict[tuple[str, str, str], ReadGroup] = {}

    def join_or_lead(self, key: tuple[str, str, str]) -> tuple[ReadGroup, bool]:
        """(the group, True when this read leads it: it makes the call)."""
        group = self.forming.get(key)
        if group is not None:
            group.followers += 1
            return group, False
        group = self.forming[key] = ReadGroup()
        return group, True

    def close(self, key: tuple[str, str, str], group: ReadGroup) -> None:
        """The leader goes in: later reads form a new group."""
        if self.forming.get(key) is group:
            del self.forming[key]


async def send_answer(send: Send, answer: Answer) -> None:
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})
