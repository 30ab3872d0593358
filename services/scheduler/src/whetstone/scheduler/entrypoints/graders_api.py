"""`POST /v1/fine_tuning/alpha/graders/validate` and `/run`, as OpenAI's API (the official client's
`client.fine_tuning.alpha.graders.validate(grader=)` / `.run(grader=, model_sample=, item=)`): a
tenant tries a grader on one sample before spending GPU time on a reinforcement job.

A grader that cannot run as given (unknown field, a template outside item/sample, a formula over
names that are not its graders, a judge model the operator did not configure, cosine without an
embeddings endpoint, a python grader without a sandbox, an `{{item.x}}` the item lacks) answers 400
naming the field. What the grader does when it runs (raises, loops, the judge refuses) is a flag in
`metadata.errors` of a 200, as in training."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from whetstone.contracts.base import JsonAtMost
from whetstone.contracts.events import GraderObject
from whetstone.graders import (
    AnyGrader,
    GraderEnvironment,
    GraderInvalid,
    MissingField,
    parse_grader,
    run_grader,
    validate,
)
from whetstone.runtime.errors import ApiError
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.service import Runtime


MAX_SAMPLE_CHARS = 1 << 20


class ValidateGrader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: GraderObject


class RunGrader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: GraderObject
    model_sample: str = Field(max_length=MAX_SAMPLE_CHARS)
    item: Annotated[Any, JsonAtMost(MAX_SAMPLE_CHARS)] = None


def invalid(exc: GraderInvalid) -> ApiError:
    return ApiError(400, exc.message if exc.message.startswith(exc.param) else f"{exc.param}: {exc.message}",
                    code=exc.code, param=exc.param)


def checked(env: GraderEnvironment, data: GraderObject) -> AnyGrader:
    try:
        grader = parse_grader(data, "grader")
        validate(grader, env.settings, env.sandbox, "grader")
    except GraderInvalid as exc:
        raise invalid(exc) from exc
    return grader


def routes(rt: Runtime[Any]) -> APIRouter:
    return router(rt.ctx.graders)   # the environment reinforcement jobs' validation uses too


def router(graders: GraderEnvironment) -> APIRouter:
    """The grader routes over one grader environment (the benchmark serves them alone)."""
    r = APIRouter(prefix="/v1/fine_tuning/alpha/graders")

    @r.post("/validate")
    async def validate_grader(body: ValidateGrader, _: Caller = require("read")) -> dict:
        grader = await asyncio.to_thread(checked, graders, body.grader)   # the first python grader probes bwrap
        return {"grader": grader.model_dump(exclude_none=True)}

    @r.post("/run")
    async def run(body: RunGrader, _: Caller = require("write")) -> dict:
        grader = await asyncio.to_thread(checked, graders, body.grader)
        try:
            result = await run_grader(grader, body.model_sample, body.item, graders, strict_item=True)
        except MissingField as exc:
            keys = sorted(body.item) if isinstance(body.item, dict) else []
            raise ApiError(400, f"grader.{exc.template}: {{{{{exc.path}}}}} names a field the item does not have "
                                f"(the item's fields: {', '.join(keys) or 'none'})",
                           code="missing_item_field", param=f"grader.{exc.template}") from exc
        return result.model_dump()

    return r
