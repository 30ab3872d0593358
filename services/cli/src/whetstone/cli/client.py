"""A small client of the public API (what `whet files|jobs|models|usage` and the demo use).

Base URL and key from WHETSTONE_BASE_URL (default http://127.0.0.1:$WHETSTONE_API_PORT/v1, port 8000)
and WHETSTONE_API_KEY. Errors are OpenAI-shaped; `ApiFailure` carries them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from .api_objects import ListItem, Page


class ErrorBody(BaseModel):
    """OpenAI's error object: what the CLI shows of a failure."""

    message: str | None = None
    type: str | None = None
    param: str | None = None
    code: str | int | None = None


class ErrorAnswer(BaseModel):
    error: ErrorBody | None = None


def error_of(r: httpx.Response) -> ErrorBody:
    """The error object of a failed answer; the answer's text when it carries none."""
    try:
        answer = ErrorAnswer.model_validate_json(r.content)
    except ValidationError:
        return ErrorBody(message=r.text[:500])
    return answer.error or ErrorBody(message=r.text)


class ApiFailure(Exception):
    def __init__(self, status: int, error: ErrorBody) -> None:
        self.status, self.error = status, error
        param = f" (param: {error.param})" if error.param else ""
        super().__init__(f"{status} {error.code or error.type or 'error'}: {error.message}{param}")


def default_base_url() -> str:
    explicit = os.environ.get("WHETSTONE_BASE_URL")
    if explicit:
        return explicit.rstrip("/")
    return f"http://127.0.0.1:{os.environ.get('WHETSTONE_API_PORT', '8000')}/v1"


class Api:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 60) -> None:
        self.base_url = (base_url or default_base_url()).rstrip("/")
        key = api_key or os.environ.get("WHETSTONE_API_KEY")
        if not key:
            raise SystemExit("no API key: set WHETSTONE_API_KEY (create one with `whet keys create TENANT`)")
        self.http = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, retries: int = 4, **kw: Any) -> Any:
        """JSON of a 2xx answer; retries 429 (after Retry-After) and 502/503 a few times."""
        for attempt in range(retries + 1):
            r = self.http.request(method, path, **kw)
            if r.status_code in (429, 502, 503) and attempt < retries and r.headers.get("x-should-retry") != "false":
                time.sleep(min(float(r.headers.get("retry-after", 1) or 1), 10) * (1 if r.status_code == 429 else 0.5))
                continue
            if r.status_code >= 400:
                raise ApiFailure(r.status_code, error_of(r))
            return r.json() if r.content else {}
        raise AssertionError("unreachable")

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict | None = None, headers: dict[str, str] | None = None) -> Any:
        return self.call("POST", path, json=body or {}, headers=headers)

    def upload(self, path: Path, purpose: str = "fine-tune") -> dict:
        with open(path, "rb") as f:  # httpx streams the file from disk
            return self.call("POST", "/files", files={"file": (path.name, f, "application/jsonl")},
                             data={"purpose": purpose}, retries=0)

    def pages(self, path: str, limit: int = 100, **params: Any) -> Iterator[dict]:
        """Every item of a list, following `after=<last id>` while `has_more`."""
        after = None
        while True:
            raw = self.get(path, limit=limit, after=after, **params)
            page = Page[ListItem].from_api(raw)
            data = raw.get("data") or []
            yield from data
            if not page.has_more or not page.data:
                return
            after = page.data[-1].id

    def events(self, job_id: str, *, limit: int = 100, after: str | None = None) -> dict:
        return self.get(f"/fine_tuning/jobs/{job_id}/events", limit=limit, after=after)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)


def poll_until(fetch: Callable[[], Any], what: str, *, timeout_s: float = 90, interval_s: float = 0.5) -> Any:
    """The first truthy value `fetch()` returns; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not available after {timeout_s}s")
        time.sleep(interval_s)
