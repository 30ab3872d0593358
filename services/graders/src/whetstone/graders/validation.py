"""A grader checked before it runs: parsed with OpenAI's field names, templates only in the item and
sample namespaces, formulas over the multi grader's own names, judge models configured by the
operator, a python source that compiles and defines `grade(sample, item)`, and a sandbox to run it.
Each failure is a `GraderInvalid` naming the field (e.g. `grader.graders.exact.input`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any

from pydantic import TypeAdapter, ValidationError

from . import formula
from .errors import GraderInvalid, first_error
from .models import (
    AnyGrader,
    Grader,
    JudgeGrader,
    MultiGrader,
    PythonGrader,
    TextGrader,
    TextPart,
    TextSimilarityGrader,
)
from .sandbox import PythonSandbox, SandboxUnavailable
from .settings import GraderSettings
from .templates import Ref, refs

GRADER = TypeAdapter(Grader)
TOP_LEVEL = ("string_check", "text_similarity", "python", "score_model", "multi")


def parse_grader(data: Any, param: str = "grader") -> AnyGrader:
    """The grader object as sent, typed; unknown fields and wrong types are refused by name."""
    if isinstance(data, dict) and data.get("type") == "label_model":
        raise GraderInvalid(f"{param}.type", "label_model graders are accepted only inside a multi grader "
                            "(as in OpenAI's API); wrap it in {\"type\": \"multi\", ...}", code="invalid_grader_type")
    if isinstance(data, dict) and data.get("type") not in TOP_LEVEL:
        raise GraderInvalid(f"{param}.type", f"must be one of {', '.join(TOP_LEVEL)}; got {data.get('type')!r}",
                            code="invalid_grader_type")
    try:
        return GRADER.validate_python(data)
    except ValidationError as exc:
        loc, message = first_error(exc)
        # the discriminated union puts the grader type first in the location: drop it
        if loc and loc[0] in TOP_LEVEL:
            loc = loc[1:]
        if len(loc) >= 3 and loc[0] == "graders" and loc[2] in ("string_check", "text_similarity", "python",
                                                                "score_model", "label_model"):
            loc = loc[:2] + loc[3:]
        raise GraderInvalid(".".join([param, *loc]), message) from exc


def templates_of(grader: AnyGrader, param: str) -> Iterator[tuple[str, str]]:
    """(field path, template string) for every field of `grader` that may hold templates."""
    if isinstance(grader, TextGrader):
        yield f"{param}.input", grader.input
        yield f"{param}.reference", grader.reference
    elif isinstance(grader, JudgeGrader):
        for i, message in enumerate(grader.input):
            for j, part in enumerate(message.parts()):
                where = f"{param}.input[{i}].content" + ("" if isinstance(message.content, str) else f"[{j}]")
                yield where, part.text if isinstance(part, TextPart) else part.image_url
    elif isinstance(grader, MultiGrader):
        for name, sub in grader.graders.items():
            yield from templates_of(sub, f"{param}.graders.{name}")


def references(grader: AnyGrader, param: str = "grader") -> list[tuple[str, Ref]]:
    """Every template reference of the grader, with the field it is in (malformed ones raise)."""
    return [(where, ref) for where, text in templates_of(grader, param) for ref in refs(text, where)]


def item_fields(grader: AnyGrader) -> list[tuple[str, ...]]:
    """The `item` paths the grader needs from each dataset row (for the RFT data gate)."""
    seen: dict[tuple[str, ...], None] = {}
    for _, ref in references(grader):
        if ref.namespace == "item":
            seen[ref.path] = None
    return list(seen)


def check_python(grader: PythonGrader, param: str) -> None:
    try:
        tree = ast.parse(grader.source, filename="grader.py")
    except SyntaxError as exc:
        raise GraderInvalid(f"{param}.source", f"does not compile: {exc.msg} (line {exc.lineno})",
                            code="invalid_python_source") from exc
    except (ValueError, RecursionError, MemoryError) as exc:
        raise GraderInvalid(f"{param}.source", f"does not compile: {type(exc).__name__}",
                            code="invalid_python_source") from exc
    grade = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "grade"), None)
    if grade is None:
        raise GraderInvalid(f"{param}.source", "must define a top-level function grade(sample, item) -> float",
                            code="invalid_python_source")
    positional = grade.args.posonlyargs + grade.args.args
    if len(positional) < 2 and grade.args.vararg is None:
        raise GraderInvalid(f"{param}.source", "grade must take two arguments: grade(sample, item)",
                            code="invalid_python_source")


def check_judge(model: str, settings: GraderSettings, param: str) -> None:
    if model not in settings.judges:
        configured = ", ".join(sorted(settings.judges)) or "none"
        raise GraderInvalid(f"{param}.model", f"{model!r} is not a grader model on this deployment "
                            f"(models the operator configured: {configured})", code="model_not_configured")


def validate(grader: AnyGrader, settings: GraderSettings, sandbox: PythonSandbox | None, param: str = "grader",
             ) -> None:
    """Every check that can be made without running the grader; raises GraderInvalid."""
    references(grader, param)
    if isinstance(grader, TextSimilarityGrader) and grader.evaluation_metric == "cosine" and settings.embeddings is None:
        raise GraderInvalid(f"{param}.evaluation_metric", "cosine needs an embeddings model and this deployment "
                            "has none configured (operator: WHETSTONE_GRADERS_EMBEDDINGS); use another metric",
                            code="metric_not_available")
    if isinstance(grader, JudgeGrader):
        check_judge(grader.model, settings, param)
    if isinstance(grader, PythonGrader):
        check_python(grader, param)
        try:
            if sandbox is None:
                raise SandboxUnavailable("python graders are not available in this process")
            sandbox.require()
        except SandboxUnavailable as exc:
            raise GraderInvalid(f"{param}.type", str(exc), code="python_grader_unavailable") from exc
    if isinstance(grader, MultiGrader):
        try:
            formula.parse(grader.calculate_output, set(grader.graders))
        except formula.FormulaError as exc:
            raise GraderInvalid(f"{param}.calculate_output", str(exc), code="invalid_formula") from exc
        for name, sub in grader.graders.items():
            validate(sub, settings, sandbox, f"{param}.graders.{name}")
