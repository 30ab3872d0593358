"""A completion request from model name to tokens: route, resolve, lease the adapter, render
with the training chat template, check the context, submit to the batcher, collect or stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from whetstone.contracts import parse_checkpoint_model
from whetstone.modelkit.image_reader import read_image_url
from whetstone.modelkit.image_rules import ImageLimits, ImageProblem
from whetstone.runtime.addresses import AllowList
from whetstone.runtime.url_fetch import FetchPolicy, fetch_port

from ..adapters.engine import GenRow, LoraEngine
from ..adapters.full_models import FullLease
from ..adapters.pool import Lease
from ..context import ServingContext
from ..domain.catalog import (
    BASE_ADAPTER, ModelNotDeployed, ModelVersion, ServingError, base_version, check_servable_on, checkpoint_version,
    choose_version, completion_budget,
)
from ..domain.full_models import is_full_weights
from ..domain.images import ImageRefused, refusal
from ..domain.openai import ChatCompletionRequest, CompletionRequest, ContentPart, RequestImage
from ..domain.routing import Route, pick_variant


ChoiceEvent = tuple[int, str, str | None]   # (choice index, text delta, finish_reason or None)


class InvalidMessages(ServingError):
    status, code, param = 400, "invalid_messages", "messages"


class GenerationFailed(ServingError):
    status, code = 500, "generation_failed"


class PromptTooLong(ServingError):
    status, code = 400, "prompt_too_long"


class TooManyMessages(ServingError):
    status, code, param = 400, "too_many_messages", "messages"


class TenantBusy(ServingError):
    """The tenant already has `max_queued_per_tenant` requests in the batcher (queued or generating)."""

    status, code = 429, "too_many_pending_requests"


def prompt_chars(req: ChatCompletionRequest | CompletionRequest) -> int:
    """Characters of the request's whole prompt (every message's text, or every prompt), counted
    before anything is rendered or tokenised."""
    if isinstance(req, ChatCompletionRequest):
        return sum(len(m.content) if isinstance(m.content, str) else
                   sum(len(p.text) for p in m.content if isinstance(p, ContentPart)) for m in req.messages)
    return sum(len(p) for p in req.prompts())


def check_prompt(req: ChatCompletionRequest | CompletionRequest, limit: int, max_messages: int) -> None:
    """The request's size before anything is rendered or tokenised: its messages and characters."""
    if isinstance(req, ChatCompletionRequest) and len(req.messages) > max_messages:
        raise TooManyMessages(f"The request has {len(req.messages)} messages; this deployment takes at most "
                              f"{max_messages} per request.")
    chars = prompt_chars(req)
    if chars > limit:
        param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
        raise PromptTooLong(f"The prompt is {chars} characters; this deployment takes at most {limit} per request "
                            f"(all of `{param}` together).", param=param)


def check_prompt_tokens(encoded: list[list[int]], limit: int, param: str) -> None:
    """Each tokenised prompt against the operator's `max_prompt_tokens` (0: no bound but the context)."""
    longest = max((len(ids) for ids in encoded), default=0)
    if limit and longest > limit:
        raise PromptTooLong(f"The prompt is {longest} tokens; this deployment takes at most {limit} per prompt "
                            f"(`{param}`).", param=param)


def admit(ctx: ServingContext, tenant_id: str) -> None:
    """One more of the tenant's requests in the batcher, or TenantBusy: a tenant's pending requests
    are capped, so one tenant's burst cannot fill the batcher's queue ahead of everyone else's."""
    held = ctx.pending.get(tenant_id, 0)
    if held >= ctx.config.max_queued_per_tenant:
        raise TenantBusy(f"This organization already has {held} completion requests pending on this replica "
                         f"({ctx.config.max_queued_per_tenant} at most); retry when one has finished.")
    ctx.pending[tenant_id] = held + 1


def leave(ctx: ServingContext, tenant_id: str) -> None:
    left = ctx.pending.get(tenant_id, 0) - 1
    if left > 0:
        ctx.pending[tenant_id] = left
    else:
        ctx.pending.pop(tenant_id, None)


def tokenize(engine: LoraEngine, req: ChatCompletionRequest | CompletionRequest,
             chat_template: str | None) -> tuple[list[list[int]], str]:
    """(prompt token ids, the request field they came from); runs in a worker thread, so a long
    prompt never holds the event loop that every other tenant's requests wait on."""
    if isinstance(req, ChatCompletionRequest):
        messages = [m.as_template_message(engine.image_token) for m in req.messages]
        try:
            prompts = [engine.render_chat(messages, chat_template)]
        except Exception as exc:  # the template refuses the conversation (e.g. an unsupported role)
            raise InvalidMessages(f"messages cannot be rendered with the model's chat template: {exc}") from exc
        param = "messages"
    else:
        prompts, param = req.prompts(), "prompt"
    return [engine.encode(p) or [engine.pad_id] for p in prompts], param


async def resolve(ctx: ServingContext, tenant_id: str, requested: str, user: str | None) -> ModelVersion:
    """The version that answers: an A/B route of that name first, else the served base model by its name,
    a checkpoint (`<fine_tuned_model>:ckpt-step-<N>`), or a version by its id or its name's live version."""
    route = ctx.catalog.routes.get((tenant_id, requested))
    if route is not None:
        versions = ctx.catalog.owned(tenant_id, [v.model_id for v in route.variants])
        live = tuple(v for v in route.variants if v.model_id in versions and versions[v.model_id].servable
                     and v.weight > 0)
        if not live:
            raise ModelNotDeployed(f"No version behind the route `{requested}` is deployed.")
        version = versions[pick_variant(Route(route.name, live), user, ctx.random.random()).model_id]
    elif requested == ctx.base_model:
        return base_version(tenant_id, requested, ctx.base_sha256)
    elif (checkpoint := parse_checkpoint_model(requested)) is not None:
        parent = ctx.catalog.public(tenant_id, checkpoint[0])
        stored = await ctx.repo.checkpoint(tenant_id, parent.job_id, checkpoint[1]) if parent and parent.job_id else None
        version = checkpoint_version(parent, requested, checkpoint[1], stored)
    else:
        version = choose_version(requested, ctx.catalog.candidates(tenant_id, requested))
    check_servable_on(version, ctx.base_sha256)
    return version


@dataclass
class Generation:
    requested: str
    version: ModelVersion
    lease: Lease | FullLease
    rows: list[GenRow]
    events: asyncio.Queue[ChoiceEvent]
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.rows)

    async def collect(self) -> list[tuple[str, str]]:
        texts, finishes = [""] * len(self.rows), [""] * len(self.rows)
        async for index, delta, finish in self.stream():
            texts[index] += delta
            if finish:
                finishes[index] = finish
        return list(zip(texts, finishes))

    async def stream(self) -> AsyncIterator[tuple[int, str, str | None]]:
        """(choice index, text delta, finish_reason or None) until every choice finished."""
        open_rows = len(self.rows)
        while open_rows:
            index, delta, finish = await self.events.get()
            if finish == "error":
                raise GenerationFailed(f"generation failed: {delta}")
            if finish:
                open_rows -= 1
            yield index, delta, finish


def read_images(images: list[RequestImage], limits: ImageLimits) -> list[str]:
    """Every image read as ingest reads it (base64, bytes, format, header pixels, one decode): the
    first refusal raised as ImageRefused naming its part. An http(s) URL, where the operator allows
    fetching, is fetched under ingest's address rules (`whetstone.runtime.url_fetch`) and read as a
    data URL of the fetched bytes. The URLs to hand the model, in order. Runs in a worker thread."""
    fetch = fetch_port(FetchPolicy(AllowList.parse(limits.fetch_allow_hosts), limits.max_bytes,
                                   limits.fetch_timeout_s)) if limits.allow_fetch else None
    urls = []
    for image in images:
        read = read_image_url(image.url, limits, image.at, fetch)
        if isinstance(read, ImageProblem):
            raise ImageRefused.of(read, image.at + ".image_url.url")
        urls.append(read[1])
    return urls


async def check_images(ctx: ServingContext, req: ChatCompletionRequest | CompletionRequest) -> list[str]:
    """The request's image URLs (as data URLs) once the shared image rules accept them (ImageRefused otherwise)."""
    images = req.images() if isinstance(req, ChatCompletionRequest) else []
    limits = ctx.config.image_limits
    refused = refusal(images, model=req.model, sees_images=ctx.engine.sees_images, limits=limits)
    if refused is not None:
        raise refused
    return await asyncio.to_thread(read_images, images, limits) if images else []


async def start(ctx: ServingContext, tenant_id: str, req: ChatCompletionRequest | CompletionRequest) -> Generation:
    check_prompt(req, ctx.config.max_prompt_chars, ctx.config.max_messages)
    version = await resolve(ctx, tenant_id, req.model, req.user)
    urls = await check_images(ctx, req)
    admit(ctx, tenant_id)
    engine, batcher, adapter = ctx.engine, ctx.batcher, version.model_id
    lease: Lease | FullLease
    try:
        if is_full_weights(version):   # its own weights: its own engine, the model alone (slot 0)
            lease = await ctx.full_models.acquire(version)
            engine, batcher, adapter = lease.engine, lease.batcher, BASE_ADAPTER
        else:
            lease = await ctx.pool.acquire(version)
    except BaseException:
        leave(ctx, tenant_id)
        raise

    def done() -> None:   # once: every row finished, or the request failed before its rows were submitted
        lease.release()
        leave(ctx, tenant_id)

    try:
        pixels = None
        encoded, param = await asyncio.to_thread(tokenize, engine, req, lease.chat_template)
        check_prompt_tokens(encoded, ctx.config.max_prompt_tokens, param)
        if isinstance(req, ChatCompletionRequest) and engine.sees_images:
            try:
                ids, pixels = await asyncio.to_thread(engine.image_inputs, encoded[0], urls)
            except ValueError as exc:
                raise InvalidMessages(str(exc)) from exc
            encoded = [ids]
        budgets = [completion_budget(len(ids), req.token_limit(), ctx.config.default_max_tokens,
                                     engine.context_length, param) for ids in encoded]
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[ChoiceEvent] = asyncio.Queue()
        rows: list[GenRow] = []
        unfinished = [len(encoded) * req.n]

        def deliver(index: int, delta: str, finish: str | None) -> None:  # on the event loop
            events.put_nowait((index, delta, finish))
            if finish:
                unfinished[0] -= 1
                if unfinished[0] == 0:
                    done()  # the adapter may be evicted only once no row of ours needs it

        for ids, budget in zip(encoded, budgets):
            for _ in range(req.n):
                index = len(rows)

                def emit(delta: str, finish: str | None, index: int = index) -> None:  # worker thread
                    batcher.post(loop, deliver, index, delta, finish)

                seed = None if req.seed is None else req.seed + index
                rows.append(GenRow(adapter=adapter, prompt_ids=ids, max_tokens=budget, emit=emit,
                                   temperature=req.temperature, top_p=req.top_p, stops=req.stops(), seed=seed,
                                   stream=bool(req.stream), pixel_values=pixels))
    except BaseException:
        done()
        raise
    for row in rows:
        batcher.submit(row)
    key = (tenant_id, req.model, version.model_id)
    ctx.served[key] = ctx.served.get(key, 0) + 1
    ctx.metrics.requests.labels(tenant=tenant_id, model=req.model, version=version.model_id, outcome="served").inc()
    return Generation(req.model, version, lease, rows, events, sum(len(ids) for ids in encoded))
