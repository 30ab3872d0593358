import json
from pathlib import Path

import pytest


@pytest.fixture
def fake_model(settings) -> str:
    """A catalog entry the scheduler can resolve and pin (sha256 of its weights); not loadable by torch —
    tests that train use the tiny model instead."""
    d = Path(settings.model_catalog) / "pinned-model"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "model.safetensors").write_bytes(b"weights-v1")
    return "pinned-model"
