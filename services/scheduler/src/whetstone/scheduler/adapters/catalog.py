"""What the scheduler may read about a base model without loading it: its config.json and
the size of its weight files (for the parameter count)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from whetstone.runtime.models import WEIGHT_SUFFIXES, ResolvedModel


def model_facts(model: ResolvedModel) -> tuple[dict[str, Any] | None, int | None]:
    """(config.json as a dict, total bytes of weight files); (None, None) for a Hub id."""
    if not model.local:
        return None, None
    directory = Path(model.location)
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    weights = sum(p.stat().st_size for p in directory.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return (config if isinstance(config, dict) else None), (weights or None)
