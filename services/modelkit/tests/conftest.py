from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from whetstone.modelkit.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from whetstone.modelkit.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)
