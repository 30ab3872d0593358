"""OpenAI-compatible completions over the tenant's fine-tuned models, and A/B routes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import ListObject, list_object
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.service import Runtime

from ..context import ServingContext
from ..domain import openai
from ..domain.catalog import ServingError
from ..usecases import inference
from ..usecases import routes as ab_routes

VERSION_HEADER = "x-whetstone-model-version"


class VariantBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=256, description="a model id (one version)")
    weight: float = Field(ge=0, le=1e6)


class RouteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    variants: list[VariantBody] = Field(min_length=1, max_length=16)


class VariantAnswer(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    model: str
    weight: float
    requests: int = Field(description="requests served through the route since this replica started")


class RouteAnswer(BaseModel):
    """An A/B route as the API shows it (read from the use case's `RouteView`)."""
    model_config = ConfigDict(from_attributes=True)
    object: Literal["serving.route"] = "serving.route"
    name: str
    variants: list[VariantAnswer]


class RouteDeleted(BaseModel):
    object: Literal["serving.route.deleted"] = "serving.route.deleted"
    name: str
    deleted: bool


def routes(rt: Runtime[ServingContext]) -> APIRouter:
    r = APIRouter()
    ctx = rt.ctx

    @contextmanager
    def refusals() -> Iterator[None]:
        try:
            yield
        except ServingError as exc:
            ctx.metrics.rejected.labels(code=exc.code).inc()
            if exc.status == 429:   # the tenant's own pending requests: retry once one has finished
                raise ApiError(429, exc.message, code=exc.code, param=exc.param, type="rate_limit_error",
                               retry=True, headers={"Retry-After": "1"}) from exc
            raise ApiError(exc.status, exc.message, code=exc.code, param=exc.param,
                           type="server_error" if exc.status >= 500 else "invalid_request_error") from exc

    async def complete(req: openai.ChatCompletionRequest | openai.CompletionRequest, caller: Caller) -> Response:
        chat = isinstance(req, openai.ChatCompletionRequest)
        refused = openai.unsupported(req)
        if refused is not None:
            ctx.metrics.rejected.labels(code=refused.code).inc()
            raise ApiError(400, refused.message, code=refused.code, param=refused.param)
        with refusals():
            gen = await inference.start(ctx, caller.tenant_id, req)
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        headers = {VERSION_HEADER: gen.version.model_id}
        if req.stream:
            return StreamingResponse(_sse(gen, req, cid, created, chat, caller.tenant_id),
                                     media_type="text/event-stream",
                                     headers={**headers, "cache-control": "no-cache"})
        with refusals():
            choices = await gen.collect()
        build = openai.chat_completion if chat else openai.text_completion
        ctx.metrics.tokens.labels(tenant=caller.tenant_id, model=req.model, version=gen.version.model_id).inc(
            gen.completion_tokens)
        return JSONResponse(build(cid, req.model, choices, gen.prompt_tokens, gen.completion_tokens, created),
                            headers=headers)

    async def _sse(gen: inference.Generation, req, cid: str, created: int, chat: bool,
                   tenant_id: str) -> AsyncIterator[str]:
        usage_null = {"usage": None} if req.include_usage() else {}
        if chat:
            for index in range(len(gen.rows)):
                yield _event({**openai.chat_chunk(cid, req.model, created, index, {"role": "assistant", "content": ""}),
                              **usage_null})
        try:
            async for index, delta, finish in gen.stream():
                if delta:
                    chunk = (openai.chat_chunk(cid, req.model, created, index, {"content": delta}) if chat
                             else openai.text_chunk(cid, req.model, created, index, delta))
                    yield _event({**chunk, **usage_null})
                if finish:
                    chunk = (openai.chat_chunk(cid, req.model, created, index, {}, finish) if chat
                             else openai.text_chunk(cid, req.model, created, index, "", finish))
                    yield _event({**chunk, **usage_null})
        except ServingError as exc:
            yield _event({"error": {"message": exc.message, "type": "server_error", "param": None, "code": exc.code}})
            return
        ctx.metrics.tokens.labels(tenant=tenant_id, model=req.model, version=gen.version.model_id).inc(
            gen.completion_tokens)
        if req.include_usage():
            usage = openai.usage(gen.prompt_tokens, gen.completion_tokens)
            chunk = (openai.chat_chunk if chat else openai.text_chunk)(cid, req.model, created, None, usage_=usage)
            yield _event(chunk)
        yield "data: [DONE]\n\n"

    @r.post("/v1/chat/completions")
    async def chat_completions(body: openai.ChatCompletionRequest, caller: Caller = require("read")) -> Response:
        return await complete(body, caller)

    @r.post("/v1/completions")
    async def completions(body: openai.CompletionRequest, caller: Caller = require("read")) -> Response:
        return await complete(body, caller)

    # -- A/B routes ------------------------------------------------------------------
    def route_view(tenant_id: str, name: str) -> RouteAnswer:
        found = ab_routes.view(ctx, tenant_id, name)
        if found is None:
            raise ApiError(404, f"No route named `{name}`.", code="route_not_found", param="name")
        return RouteAnswer.model_validate(found)

    @r.put("/v1/serving/routes/{name}")
    async def put_route(name: str, body: RouteBody, caller: Caller = require("models:promote")) -> RouteAnswer:
        with refusals():
            await ab_routes.put_route(ctx, caller.tenant_id, name, [(v.model, v.weight) for v in body.variants],
                                      caller.key_id)
        return route_view(caller.tenant_id, name)

    @r.get("/v1/serving/routes")
    async def list_routes(caller: Caller = require("read")) -> ListObject[RouteAnswer]:
        return list_object([RouteAnswer.model_validate(v) for v in ab_routes.views(ctx, caller.tenant_id)])

    @r.get("/v1/serving/routes/{name}")
    async def get_route(name: str, caller: Caller = require("read")) -> RouteAnswer:
        return route_view(caller.tenant_id, name)

    @r.delete("/v1/serving/routes/{name}")
    async def delete_route(name: str, caller: Caller = require("models:promote")) -> RouteDeleted:
        if not await ab_routes.delete_route(ctx, caller.tenant_id, name, caller.key_id):
            raise ApiError(404, f"No route named `{name}`.", code="route_not_found", param="name")
        return RouteDeleted(name=name, deleted=True)

    return r


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
