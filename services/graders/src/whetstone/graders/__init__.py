"""Fine-tuning graders as OpenAI's API defines them, usable by any service: parse and validate a
grader (`parse_grader`, `validate`), run it on one sample (`run_grader`), list the item fields it
needs (`item_fields`). Operator settings: `GraderSettings` (prefix WHETSTONE_GRADERS_)."""

from .engine import GraderEnvironment, RunErrors, RunMetadata, RunResult, run_grader
from .errors import GraderInvalid
from .models import (
    AnyGrader,
    Grader,
    LabelModelGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from .sandbox import SandboxUnavailable
from .settings import Endpoint, GraderSettings
from .templates import MissingField
from .validation import item_fields, parse_grader, references, validate

__all__ = [
    "AnyGrader", "Endpoint", "Grader", "GraderEnvironment", "GraderInvalid", "GraderSettings", "LabelModelGrader",
    "MissingField", "MultiGrader", "PythonGrader", "RunErrors", "RunMetadata", "RunResult", "SandboxUnavailable",
    "ScoreModelGrader", "StringCheckGrader", "TextSimilarityGrader", "item_fields", "parse_grader", "references",
    "run_grader", "validate",
]
