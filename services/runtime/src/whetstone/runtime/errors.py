"""HTTP errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every service app installs `install_error_handlers`, so a route raises `ApiError(...)` and the
client (the official `openai` SDK included) gets the shape it parses. Errors that a retry cannot
fix carry `x-should-retry: false`, which the SDK honours instead of retrying 409s and 5xx.
An exception caused by an unreachable dependency (PostgreSQL restarting, S3 or the broker down)
answers 503 `service_unavailable` with `Retry-After`, which the SDK waits and retries; any other
unhandled exception answers 500 in the same shape, never a bare text 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiokafka import errors as kafka_errors
from botocore import exceptions as boto_errors
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .delivery import unavailable_dependency


@dataclass(frozen=True)
class FieldError:
    """The first error of a pydantic validation, as a 400 names it: the field's dotted path ("" for the
    value itself), pydantic's message, and whether the field was required and missing."""

    path: str
    message: str
    missing: bool

    @classmethod
    def first_of(cls, exc: ValidationError) -> FieldError:
        first = exc.errors()[0]
        return cls(".".join(str(p) for p in first["loc"]), first["msg"], first["type"] == "missing")


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry: bool | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = dict(headers or {})
        if retry is False or (retry is None and status in (400, 401, 403, 404, 409, 422)):
            self.headers.setdefault("x-should-retry", "false")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _from_http_exception(exc: StarletteHTTPException) -> ApiError:
    detail = exc.detail
    if isinstance(detail, dict):
        return ApiError(exc.status_code, str(detail.get("message", detail)), code=detail.get("code"),
                        param=detail.get("param"), type=detail.get("type", _type_of(exc.status_code)),
                        headers=exc.headers)
    if exc.status_code == 404 and detail == "Not Found":      # the router's own: no route has this path
        return ApiError(404, "Unknown request URL. Please check the URL and method; the routes are listed in "
                        "the README's Public API section.", code="unknown_url")
    if exc.status_code == 405:
        return ApiError(405, f"This route does not take this method ({detail}).", code="method_not_allowed",
                        headers=exc.headers)
    return ApiError(exc.status_code, str(detail), type=_type_of(exc.status_code), headers=exc.headers)


def _type_of(status: int) -> str:
    return {401: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
            429: "rate_limit_error"}.get(status, "server_error" if status >= 500 else "invalid_request_error")


RETRY_AFTER_S = 2  # a PostgreSQL restart or a broker election takes seconds; the SDK waits this long
_log = logging.getLogger("whetstone.http")
def unexpected_error(request: Request, exc: Exception) -> ApiError:
    """503 with Retry-After when a dependency is unreachable, else a 500; both in OpenAI's shape."""
    dependency = unavailable_dependency(exc)
    if dependency is not None:
        _log.warning("%s %s: %s unreachable (%s: %s): 503", request.method, request.url.path, dependency,
                     type(exc).__name__, exc)
        return ApiError(503, f"The service's {dependency} is unreachable right now; retry shortly.",
                        type="server_error", code="service_unavailable", retry=True,
                        headers={"Retry-After": str(RETRY_AFTER_S), "x-should-retry": "true"})
    _log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return ApiError(500, "The server had an error while processing the request.", type="server_error",
                    code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    # Starlette's class, not FastAPI's subclass: the router's own 404/405 for an unknown path or method
    # are Starlette's and would otherwise answer {"detail": "Not Found"}
    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _from_http_exception(exc).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        param = ".".join(loc) or None
        message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
        return ApiError(400, message, code="invalid_value", param=param).response()

    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error(request, exc).response()

    # the dependencies' own exception classes are answered where the route raised them (no traceback
    # re-raised to the server); anything else reaches the last handler, which answers in the same shape
    for cls in (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, boto_errors.BotoCoreError,
                boto_errors.ClientError, kafka_errors.KafkaError, Exception):
        app.add_exception_handler(cls, _unexpected)
