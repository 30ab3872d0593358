"""Running a grader on one sample: the reward and OpenAI's `GraderRunResponse` shape around it.

A run never raises for what the grader or the model did: the reward is 0.0 and the cause is a flag
in `metadata.errors` (python_grader_runtime_error with its details, unresponsive_reward_error on a
timeout, model_grader_*_error for judges, sample_parse_error when `sample.output_json` is needed and
the output is not JSON, formula errors). An `{{item.x}}` the item lacks is the caller's mistake: it
raises `MissingField` when `strict_item` (the `/run` API answers 400), else it is the
`invalid_variable_error` flag (during training)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, Field

from . import formula, judges, similarity
from .models import (
    AnyGrader,
    ImagePart,
    LabelModelGrader,
    Message,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from .sandbox import PythonSandbox, SandboxUnavailable
from .settings import GraderSettings
from .templates import MissingField, Sample, SampleParseError, render


class RunErrors(BaseModel):
    formula_parse_error: bool = False
    invalid_variable_error: bool = False
    model_grader_parse_error: bool = False
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    model_grader_server_error_details: str | None = None
    other_error: bool = False
    python_grader_runtime_error: bool = False
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = False

    def any(self) -> bool:
        return any(v is True for v in self.model_dump().values())


class RunMetadata(BaseModel):
    name: str
    type: str
    errors: RunErrors
    execution_time: float
    scores: dict[str, float] = Field(default_factory=dict)
    token_usage: int | None = None
    sampled_model_name: str | None = None


class RunResult(BaseModel):
    """As `openai.types.fine_tuning.alpha.GraderRunResponse`."""
    reward: float
    metadata: RunMetadata
    sub_rewards: dict[str, float] = Field(default_factory=dict)
    model_grader_token_usage_per_model: dict[str, judges.Usage] = Field(default_factory=dict)


class GraderFailed(Exception):
    """One grader could not produce a score; the flag is already set on the run."""


@dataclass
class Run:
    errors: RunErrors = field(default_factory=RunErrors)
    usage: dict[str, judges.Usage] = field(default_factory=dict)
    strict_item: bool = False

    def fail(self, **flags: Any) -> GraderFailed:
        for key, value in flags.items():
            setattr(self.errors, key, value)
        return GraderFailed(next(iter(flags)))


class GraderEnvironment:
    """What running graders needs from the deployment: the operator's settings, the python sandbox
    and one HTTP client for judges and embeddings."""

    def __init__(self, settings: GraderSettings | None = None) -> None:
        self.settings = settings or GraderSettings()
        self.sandbox = PythonSandbox(self.settings.sandbox())
        self._http: httpx.AsyncClient | None = None

    def http(self) -> httpx.AsyncClient:
        if self._http is None or self._http.is_closed:
            self._http = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


async def run_grader(grader: AnyGrader, model_sample: str, item: Any, env: GraderEnvironment,
                     strict_item: bool = False, sampled_model_name: str | None = None) -> RunResult:
    began = time.perf_counter()
    run = Run(strict_item=strict_item)
    sample = Sample.of(model_sample)
    sub_rewards: dict[str, float] = {}
    try:
        if isinstance(grader, MultiGrader):
            reward = await multi(grader, sample, item, env, run, sub_rewards)
        else:
            reward = await score(grader, sample, item, env, run)
    except GraderFailed:
        reward = 0.0
    tokens = sum(u.total_tokens for u in run.usage.values())
    scores = dict(sub_rewards) if isinstance(grader, MultiGrader) else ({grader.name: reward}
                                                                         if not run.errors.any() else {})
    return RunResult(
        reward=reward,
        metadata=RunMetadata(name=grader.name, type=grader.type, errors=run.errors,
                             execution_time=time.perf_counter() - began, scores=scores,
                             token_usage=tokens if run.usage else None, sampled_model_name=sampled_model_name),
        sub_rewards=sub_rewards,
        model_grader_token_usage_per_model=dict(run.usage))


async def multi(grader: MultiGrader, sample: Sample, item: Any, env: GraderEnvironment, run: Run,
                sub_rewards: dict[str, float]) -> float:
    try:
        tree = formula.parse(grader.calculate_output, set(grader.graders))
    except formula.FormulaError as exc:
        raise run.fail(formula_parse_error=True) from exc
    names = list(grader.graders)
    outcomes = await asyncio.gather(*(score(grader.graders[n], sample, item, env, run) for n in names),
                                    return_exceptions=True)
    failed = None
    for name, outcome in zip(names, outcomes, strict=True):
        if isinstance(outcome, GraderFailed):
            failed = outcome
        elif isinstance(outcome, MissingField):
            raise MissingField(f"graders.{name}.{outcome.template}", outcome.path, str(outcome)) from outcome
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            sub_rewards[name] = outcome
    if failed is not None:
        raise failed
    try:
        return formula.evaluate(tree, sub_rewards)
    except formula.EvaluationError as exc:
        raise run.fail(other_error=True) from exc


def rendered(template: str, sample: Sample, item: Any, where: str, run: Run) -> str:
    try:
        return render(template, sample, item, where)
    except MissingField:
        if run.strict_item:
            raise
        raise run.fail(invalid_variable_error=True) from None
    except SampleParseError as exc:
        raise run.fail(sample_parse_error=True) from exc


async def score(grader: AnyGrader, sample: Sample, item: Any, env: GraderEnvironment, run: Run) -> float:
    match grader:
        case StringCheckGrader():
            return string_check(grader, sample, item, run)
        case TextSimilarityGrader():
            return await text_similarity(grader, sample, item, env, run)
        case PythonGrader():
            return await python(grader, sample, item, env, run)
        case ScoreModelGrader() | LabelModelGrader():
            return await model_grader(grader, sample, item, env, run)
    raise run.fail(other_error=True)


def string_check(grader: StringCheckGrader, sample: Sample, item: Any, run: Run) -> float:
    text = rendered(grader.input, sample, item, "input", run)
    reference = rendered(grader.reference, sample, item, "reference", run)
    match grader.operation:
        case "eq":
            return float(text == reference)
        case "ne":
            return float(text != reference)
        case "like":
            return float(reference in text)
        case _:
            return float(reference.casefold() in text.casefold())


async def text_similarity(grader: TextSimilarityGrader, sample: Sample, item: Any, env: GraderEnvironment,
                          run: Run) -> float:
    text = rendered(grader.input, sample, item, "input", run)
    reference = rendered(grader.reference, sample, item, "reference", run)
    if grader.evaluation_metric != "cosine":
        return similarity.LEXICAL[grader.evaluation_metric](text, reference)
    endpoint = env.settings.embeddings
    if endpoint is None:
        raise run.fail(other_error=True)
    try:
        a, b = await judges.embed(env.http(), endpoint, [text, reference])
        return similarity.cosine(a, b)
    except (judges.JudgeServerError, ValueError) as exc:
        raise run.fail(model_grader_server_error=True, model_grader_server_error_details=str(exc)) from exc


async def python(grader: PythonGrader, sample: Sample, item: Any, env: GraderEnvironment, run: Run) -> float:
    try:
        outcome = await env.sandbox.run(grader.source, sample.as_dict(), item)
    except SandboxUnavailable as exc:
        raise run.fail(python_grader_server_error=True, python_grader_server_error_type="sandbox_unavailable") \
            from exc
    if outcome.reward is not None:
        return outcome.reward
    if outcome.runtime_error is not None:
        raise run.fail(python_grader_runtime_error=True, python_grader_runtime_error_details=outcome.runtime_error)
    if outcome.server_error == "timeout":
        raise run.fail(unresponsive_reward_error=True, python_grader_server_error=True,
                       python_grader_server_error_type="timeout")
    raise run.fail(python_grader_server_error=True, python_grader_server_error_type=outcome.server_error)


def chat_messages(messages: list[Message], sample: Sample, item: Any, run: Run) -> list[judges.ChatMessage]:
    """The grader's input messages rendered for the judge (a developer message is a system one there)."""
    out: list[judges.ChatMessage] = []
    for i, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        if isinstance(message.content, str):
            text = rendered(message.content, sample, item, f"input[{i}].content", run)
            out.append(judges.ChatMessage(role=role, content=text))
            continue
        parts = []
        for j, part in enumerate(message.parts()):
            where = f"input[{i}].content[{j}]"
            if isinstance(part, ImagePart):
                url = judges.ImageUrl(url=rendered(part.image_url, sample, item, where, run), detail=part.detail)
                parts.append(judges.ChatPart(type="image_url", image_url=url))
            else:
                parts.append(judges.ChatPart(type="text", text=rendered(part.text, sample, item, where, run)))
        out.append(judges.ChatMessage(role=role, content=parts))
    return out


async def model_grader(grader: ScoreModelGrader | LabelModelGrader, sample: Sample, item: Any,
                       env: GraderEnvironment, run: Run) -> float:
    endpoint = env.settings.judges.get(grader.model)
    if endpoint is None:
        raise run.fail(model_grader_server_error=True,
                       model_grader_server_error_details=f"{grader.model!r} is not a configured grader model")
    messages = chat_messages(grader.input, sample, item, run)
    if isinstance(grader, ScoreModelGrader):
        low, high = grader.bounds()
        instruction = f"Answer with a JSON object {{\"result\": <a number from {low:g} to {high:g}>}}."
        response_format = judges.score_format(low, high)
        sampling = grader.sampling_params
    else:
        instruction = f"Answer with a JSON object {{\"result\": <one of {grader.labels}>}}."
        response_format, sampling = judges.label_format(grader.labels), None
    messages.append(judges.ChatMessage(role="system", content=instruction))
    try:
        answer = await judges.chat(env.http(), endpoint, grader.model, messages, response_format, sampling)
    except judges.JudgeServerError as exc:
        raise run.fail(model_grader_server_error=True, model_grader_server_error_details=str(exc)) from exc
    run.usage.setdefault(grader.model, judges.Usage()).add(answer.usage)
    if answer.refusal:
        raise run.fail(model_grader_refusal_error=True)
    if not answer.content:
        raise run.fail(model_grader_parse_error=True)
    if isinstance(grader, ScoreModelGrader):
        value = judges.parse_score(answer.content)
        if value is None or not math.isfinite(value) or not low <= value <= high:
            raise run.fail(model_grader_parse_error=True)
        return value
    label = judges.parse_label(answer.content, grader.labels)
    if label is None:
        raise run.fail(model_grader_parse_error=True)
    return float(label in grader.passing_labels)
