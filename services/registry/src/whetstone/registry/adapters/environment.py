"""The registry's own environment lockfile (`whetstone.runtime.environment`): recorded for an
artifact that brings none of its own (the trainer child writes one into every final artifact)."""

from __future__ import annotations

from typing import Any

from whetstone.runtime.environment import capture_environment as _capture


def capture_environment(source: str = "registry") -> dict[str, Any]:
    return _capture(source).to_dict()
