import importlib.util
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def _chat_demo_module():
    path = REPO_ROOT / "examples" / "datasets" / "make_chat_demo.py"
    spec = importlib.util.spec_from_file_location("make_chat_demo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def chat_demo():
    return _chat_demo_module()


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    from whetstone.modelkit.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("base") / "tiny-llama", seed=0)


@pytest.fixture(scope="session")
def data_files(tmp_path_factory, chat_demo) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    return {
        "train": chat_demo.write_jsonl(chat_demo.generate_rows(40, seed=0), root / "train.jsonl"),
        "holdout": chat_demo.write_jsonl(chat_demo.generate_rows(32, seed=99), root / "holdout.jsonl"),
    }
