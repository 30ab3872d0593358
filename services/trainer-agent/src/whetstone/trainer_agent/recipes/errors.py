"""Recipe failures, each with the class the platform bills by.

- user: the user's data or hyperparameters are at fault (not retried, billed);
- platform: the platform is at fault (bad config from the agent, missing files, crashes);
- ambiguous: neither clearly (e.g. out of memory even at micro-batch 1 on the assigned GPU).
"""

from __future__ import annotations

from whetstone.contracts.enums import ErrorClass

from ..domain.recipe_io import Failed


class RecipeError(Exception):
    """A failure reported to the parent as a `failed` event."""

    error_class = ErrorClass.PLATFORM
    default_code = "training_failed"

    def __init__(self, message: str, *, code: str | None = None, advice: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.advice = list(advice or [])

    def event(self) -> Failed:
        return Failed(error_class=self.error_class, code=self.code, message=str(self), advice=self.advice)


class UserError(RecipeError):
    """The user's data or hyperparameters are at fault (not retried by the platform)."""

    error_class = ErrorClass.USER
    default_code = "invalid_input"


class PlatformError(RecipeError):
    """The platform is at fault (bad config from the agent, missing files, crashes)."""

    error_class = ErrorClass.PLATFORM
    default_code = "platform_error"


class AmbiguousError(RecipeError):
    """Neither side is clearly at fault (billing policy decides)."""

    error_class = ErrorClass.AMBIGUOUS
    default_code = "ambiguous_failure"


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA/CPU allocator failures, whatever exception type the backend raised."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text
    )
