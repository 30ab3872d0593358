"""The create-job body the cli sends (`whet jobs create`, `whet jobs reproduce`): the API's own model,
`scheduler/entrypoints/requests.CreateJob`, so the cli builds exactly the fields the API takes and a
value out of the API's bounds is refused here, naming its field. Sent as JSON without the fields left unset.

jobs_cli imports this module only when it builds a body (the scheduler's request module pulls in the
graders: start-up time that the cli's other commands do not pay)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError
from whetstone.scheduler.entrypoints.requests import (
    CreateJob,
    Hyperparams,
    MethodConfig,
    MethodSpec,
    PlatformMethod,
)

from .errors import BadInput

__all__ = ["CreateJob", "Family", "Hyperparams", "MethodSpec", "PlatformName", "ReinforcementBody", "checked_body",
           "method_spec", "reinforcement_spec", "request_json"]
Family = Literal["supervised", "dpo"]
PlatformName = Literal["lora", "qlora", "full", "cpt", "dpo", "orpo"]


class ReinforcementBody(BaseModel):
    """OpenAI's `method.reinforcement` object: the grader (checked locally by graders_cli.read_grader), its
    knobs, and the response format the samples should follow."""

    model_config = ConfigDict(extra="forbid")
    grader: JsonValue
    hyperparameters: Hyperparams | None = None
    response_format: JsonValue = None


def method_spec(family: Family, platform: PlatformName | None, hp: Hyperparams) -> MethodSpec:
    """`{"type": family, family: {"hyperparameters": hp}, "whetstone": {"method": platform}}`, the parts
    without a value left out."""
    config = MethodConfig(hyperparameters=hp) if hp else None
    return MethodSpec(type=family, whetstone=PlatformMethod(method=platform) if platform else None,
                      supervised=config if family == "supervised" else None,
                      dpo=config if family == "dpo" else None)


def reinforcement_spec(body: ReinforcementBody, qlora: bool) -> MethodSpec:
    """`{"type": "reinforcement", "reinforcement": {...}}`; `qlora`: the platform's extension, LoRA on a 4-bit
    NF4 base."""
    return MethodSpec(type="reinforcement", reinforcement=body.model_dump(mode="json", exclude_none=True),
                      whetstone=PlatformMethod(method="qlora") if qlora else None)


@contextmanager
def checked_body() -> Iterator[None]:
    """Building a body: a value out of the API's bounds is a BadInput naming its field."""
    try:
        yield
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise BadInput(f"{where}: {first['msg']}") from exc


def request_json(body: CreateJob) -> dict[str, object]:
    """The body as the API reads it: the fields given, none of the defaults the API fills itself."""
    wire: dict[str, object] = body.model_dump(mode="json", exclude_none=True, exclude_unset=True)
    return wire
