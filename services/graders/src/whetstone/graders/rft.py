"""Reinforcement fine-tuning's method object as OpenAI's client sends it, what its knobs become on
this platform, and the data gate of an RFT training file. Pure.

`method = {"type": "reinforcement", "reinforcement": {"grader": {...}, "hyperparameters": {...},
"response_format": {...}}}` (fields as `openai.types.fine_tuning.ReinforcementMethod` and
`ReinforcementHyperparameters`; `response_format` is accepted and recorded as the issue asks).
Every hyperparameter is "auto" or a number; "auto" takes the platform's default:

| knob                      | auto  | becomes                                                       |
|---------------------------|-------|---------------------------------------------------------------|
| n_epochs                  | 1     | passes over the prompts                                       |
| batch_size                | 8     | prompts per optimiser step (x generations completions)        |
| learning_rate_multiplier  | 1.0   | x the method's default learning rate (1e-5), up to rate 1     |
| compute_multiplier        | 1.0   | completions sampled per prompt: round(4 x multiplier), 2..64  |
| eval_interval             | 10    | optimiser steps between evaluations on the validation prompts |
| eval_samples              | 1     | completions sampled per validation prompt at each evaluation  |
| reasoning_effort          | default | completion budget per sample: low 128, default/medium 256, high 512 tokens |
| max_completion_tokens     | (none)  | the platform's own knob, not OpenAI's: the completion budget itself (1..4096), in place of reasoning_effort's |

The completion budget bounds training's samples and, as a cap, the gate's held-out completions. A
model that never writes its end-of-sequence token (a small or untrained one) uses all of it on every
sample, so a task with short answers is cheaper with a small `max_completion_tokens`.

The data gate: each row is a JSON object whose `messages` end with a `user` turn (the model writes
the next one), and every `{{item.x}}` the grader reads is present in every row; a problem names the
line. The token estimate counts generations: prompt tokens + samples x completion budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from .errors import GraderInvalid, first_error
from .models import AnyGrader
from .templates import lookup
from .validation import item_fields, parse_grader

Auto = Literal["auto"]
COMPLETION_BUDGET = {"low": 128, "default": 256, "medium": 256, "high": 512}
BASE_GENERATIONS = 4
DEFAULT_LEARNING_RATE = 1e-5
WHOLE_BOUNDS = {"n_epochs": (1, 50), "batch_size": (1, 256), "eval_interval": (1, 100_000), "eval_samples": (1, 16),
                "max_completion_tokens": (1, 4096)}


class ReinforcementHyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_epochs: Auto | int | None = None
    batch_size: Auto | int | None = None
    learning_rate_multiplier: Auto | float | None = None
    compute_multiplier: Auto | float | None = None
    eval_interval: Auto | int | None = None
    eval_samples: Auto | int | None = None
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = None
    max_completion_tokens: Auto | int | None = None

    @field_validator(*WHOLE_BOUNDS, mode="before")
    @classmethod
    def whole(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("must be 'auto' or a whole number")
        return int(value) if isinstance(value, float) else value

    @field_validator(*WHOLE_BOUNDS)
    @classmethod
    def within(cls, value: Any, info: ValidationInfo) -> Any:
        low, high = WHOLE_BOUNDS[str(info.field_name)]
        if isinstance(value, int) and not low <= value <= high:
            raise ValueError(f"must be 'auto' or a whole number from {low} to {high}")
        return value

    @field_validator("compute_multiplier")
    @classmethod
    def multiplier(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not 0 < value <= 10:
            raise ValueError("must be 'auto' or a number > 0 and <= 10")
        return value

    @field_validator("learning_rate_multiplier")
    @classmethod
    def rate(cls, value: Any) -> Any:
        """As for every method: any multiple of the default whose learning rate stays <= 1."""
        if isinstance(value, int | float) and not 0 < value * DEFAULT_LEARNING_RATE <= 1:
            raise ValueError(f"must be 'auto' or a number > 0 and <= {1 / DEFAULT_LEARNING_RATE:g} "
                             f"(a learning rate of at most 1)")
        return value


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: dict[str, Any]


class ReinforcementMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: dict[str, Any]
    hyperparameters: ReinforcementHyperparameters = Field(default_factory=ReinforcementHyperparameters)
    response_format: ResponseFormat | None = None


@dataclass(frozen=True)
class ReinforcementPlan:
    """The method object resolved: the typed grader and every knob as a number."""
    grader: AnyGrader
    n_epochs: int
    batch_size: int
    learning_rate: float
    generations: int                 # completions per prompt (from compute_multiplier)
    eval_interval: int
    eval_samples: int
    reasoning_effort: str
    max_completion_tokens: int       # given, or from reasoning_effort
    response_format: dict[str, Any] | None

    def record(self) -> dict[str, Any]:
        """What a job records and a trainer reads (plain JSON)."""
        return {"grader": self.grader.model_dump(exclude_none=True), "n_epochs": self.n_epochs,
                "batch_size": self.batch_size, "learning_rate": self.learning_rate, "generations": self.generations,
                "eval_interval": self.eval_interval, "eval_samples": self.eval_samples,
                "reasoning_effort": self.reasoning_effort, "max_completion_tokens": self.max_completion_tokens,
                "response_format": self.response_format}


def parse_method(data: Any, param: str = "method.reinforcement") -> ReinforcementPlan:
    """The `reinforcement` object, checked (unknown fields named) and resolved. Raises GraderInvalid
    with the field's path; the grader itself is checked by `validation.validate` separately (that
    needs the deployment's settings)."""
    try:
        method = ReinforcementMethod.model_validate(data)
    except ValidationError as exc:
        loc, message = first_error(exc)
        raise GraderInvalid(".".join([param, *loc]), message, code="invalid_value") from exc
    grader = parse_grader(method.grader, f"{param}.grader")
    hp = method.hyperparameters

    def given(value: Any, default: Any) -> Any:
        return default if value in (None, "auto") else value

    multiplier = given(hp.compute_multiplier, 1.0)
    effort = hp.reasoning_effort or "default"
    return ReinforcementPlan(
        grader=grader, n_epochs=given(hp.n_epochs, 1), batch_size=given(hp.batch_size, 8),
        learning_rate=DEFAULT_LEARNING_RATE * given(hp.learning_rate_multiplier, 1.0),
        generations=max(2, min(64, round(BASE_GENERATIONS * multiplier))),
        eval_interval=given(hp.eval_interval, 10), eval_samples=given(hp.eval_samples, 1),
        reasoning_effort=effort, max_completion_tokens=given(hp.max_completion_tokens, COMPLETION_BUDGET[effort]),
        response_format=method.response_format.model_dump() if method.response_format else None)


# -- the data gate -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowProblem:
    line: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def check_row(row: Any, line: int, fields: list[tuple[str, ...]]) -> list[RowProblem]:
    if not isinstance(row, dict):
        return [RowProblem(line, "not_an_object", "the row is not a JSON object")]
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return [RowProblem(line, "missing_messages", "`messages` must be a non-empty list of messages")]
    problems = []
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        role = last.get("role") if isinstance(last, dict) else type(last).__name__
        problems.append(RowProblem(line, "last_message_not_user", f"the last message is {role!r}; in reinforcement "
                                   "fine-tuning it must be 'user' (the model writes the next turn)"))
    for path in fields:
        if not lookup(row, path)[0]:
            name = ".".join(("item", *path))
            problems.append(RowProblem(line, "missing_item_field",
                                       f"{{{{{name}}}}} is read by the grader but the row has no {'.'.join(path)!r}"))
    return problems


def check_rows(rows: Iterable[tuple[int, Any]], grader: AnyGrader, limit: int = 20) -> tuple[list[RowProblem], int]:
    """(the first `limit` problems, how many in all) over (line number, parsed row) pairs."""
    fields = item_fields(grader)
    shown: list[RowProblem] = []
    total = 0
    for line, row in rows:
        problems = check_row(row, line, fields)
        total += len(problems)
        shown.extend(problems[: max(0, limit - len(shown))])
    return shown, total


class RowPart(BaseModel):
    """A content part of a row's message (OpenAI's chat shape); text parts carry the prompt's text."""
    type: str | None = None
    text: str | None = None


class RowMessage(BaseModel):
    """A message of an RFT row: its role and its content (a string or content parts)."""
    role: str
    content: str | list[RowPart] | None = None


class RowMessages(BaseModel):
    messages: list[RowMessage] = Field(min_length=1)


@dataclass(frozen=True)
class RftRecord:
    """One RFT row, read once: its conversation typed, and the whole row as the grader's `item`."""
    messages: list[RowMessage]
    item: dict[str, Any]

    @classmethod
    def parse(cls, row: Any) -> RftRecord:
        """Raises pydantic's ValidationError (its first error's `loc` names the message)."""
        return cls(RowMessages.model_validate(row).messages, row)


def generation_tokens(prompt_tokens: int, rows: int, plan: ReinforcementPlan) -> int:
    """Tokens a run processes at most: every prompt, each epoch, with `generations` samples of up
    to the completion budget (the sampled tokens are also scored by the policy: counted once)."""
    return plan.n_epochs * (prompt_tokens * plan.generations + rows * plan.generations * plan.max_completion_tokens)


# -- the gate ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardVerdict:
    verdict: Literal["passed", "failed"]
    reason: str


def reward_gate(base_reward: float, candidate_reward: float, margin: float = 0.05) -> RewardVerdict:
    """A reinforcement candidate passes when its mean reward on held-out prompts, under the job's own
    grader, beats the base model's by at least `margin`."""
    gain = candidate_reward - base_reward
    if gain >= margin:
        return RewardVerdict("passed", f"mean reward {candidate_reward:.4f} vs base {base_reward:.4f} "
                                       f"(+{gain:.4f} >= margin {margin:g})")
    return RewardVerdict("failed", f"mean reward {candidate_reward:.4f} does not beat the base's {base_reward:.4f} "
                                   f"by the margin {margin:g} (gain {gain:+.4f}): quarantined")
