"""The one error a grader definition can fail with before it runs: which field, and why."""

from __future__ import annotations

from pydantic import ValidationError


class GraderInvalid(ValueError):
    """A grader that cannot be run as given. `param` names the offending field (dotted path under the
    grader, e.g. `grader.graders.exact.input`), `code` is a stable machine-readable reason."""

    def __init__(self, param: str, message: str, code: str = "invalid_grader") -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message, self.code = param, message, code


def first_error(exc: ValidationError) -> tuple[list[str], str]:
    """The first error of a validation: its location as path segments, and its message ("unknown field"
    for a field the model does not have)."""
    first = exc.errors()[0]
    message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    return [str(p) for p in first["loc"]], message
