"""Request-body caps at the edge: a route takes at most `max_body_bytes`, an upload route
(`upload_paths`) at most `max_upload_bytes`. A declared Content-Length over the cap is refused
before one byte is read; a body without one (chunked) is counted as it is read and refused once
past the cap, whether it is buffered here or streamed on to the service. A refused body is
drained as the services drain theirs (runtime.http.drain)."""

from __future__ import annotations

from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import drain

from .config import GatewaySettings


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit

    def error(self) -> ApiError:
        return too_large(self.limit)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than this route accepts ({limit} bytes).",
                    code="request_too_large", retry=False)


def body_limit(settings: GatewaySettings, path: str) -> int:
    return settings.max_upload_bytes if path in settings.upload_paths else settings.max_body_bytes


def declared_too_large(headers: dict[str, str], limit: int) -> ApiError | None:
    length = headers.get("content-length")
    if length is None:
        return None
    if not length.strip().isdigit():
        return ApiError(400, "Content-Length is not a number.", code="invalid_request")
    return too_large(limit) if int(length) > limit else None


def counted(receive, limit: int):
    """`receive`, raising BodyTooLarge once the body read so far is over `limit`."""
    seen = 0

    async def wrapped() -> dict:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                await drain(receive, message)
                raise BodyTooLarge(limit)
        return message

    return wrapped
