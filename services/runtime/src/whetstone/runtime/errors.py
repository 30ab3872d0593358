"""HTTP errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every service app installs `install_error_handlers`, so a route raises `ApiError(...)` and the
client (the official `openai` SDK included) gets the shape it parses. Errors that a retry cannot
fix carry `x-should-retry: false`, which the SDK honours instead of retrying 409s and 5xx.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry: bool | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = dict(headers or {})
        if retry is False or (retry is None and status in (400, 401, 403, 404, 409, 422)):
            self.headers.setdefault("x-should-retry", "false")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _from_http_exception(exc: HTTPException) -> ApiError:
    detail = exc.detail
    if isinstance(detail, dict):
        return ApiError(exc.status_code, str(detail.get("message", detail)), code=detail.get("code"),
                        param=detail.get("param"), type=detail.get("type", _type_of(exc.status_code)),
                        headers=exc.headers)
    return ApiError(exc.status_code, str(detail), type=_type_of(exc.status_code), headers=exc.headers)


def _type_of(status: int) -> str:
    return {401: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
            429: "rate_limit_error"}.get(status, "server_error" if status >= 500 else "invalid_request_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return _from_http_exception(exc).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        param = ".".join(loc) or None
        message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
        return ApiError(400, message, code="invalid_value", param=param).response()
