from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    from whetstone.modelkit.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("serving-base") / "tiny-llama", seed=0)


@pytest.fixture(scope="session")
def sample_adapters(tiny_base, tmp_path_factory) -> list[Path]:
    """Four random LoRA adapters on the tiny base (PEFT format, tokenizer + chat template inside)."""
    from whetstone.devstack.serving_samples import make_adapter

    root = tmp_path_factory.mktemp("serving-adapters")
    return [make_adapter(tiny_base, root / f"a{i}", seed=i) for i in range(4)]
