import shutil

import pytest

from whetstone.modelkit.loading import ModelNotFoundError, is_local_ref, load_model, load_tokenizer

pytestmark = pytest.mark.unit


def test_local_dir_loads(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype="float32")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.chat_template


@pytest.mark.parametrize(
    ("ref", "local"),
    [("meta-llama/Llama-3.2-1B", False), ("gpt2", False), ("./models/x", True), ("/abs/path", True),
     ("a/b/c", True), ("~/models/x", True)],
)
def test_local_vs_hub_refs(ref, local):
    assert is_local_ref(ref) is local


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


def test_missing_files_are_named(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="no weights .*model.safetensors"):
        load_model(broken)
    (broken / "config.json").unlink()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(broken)
    (broken / "tokenizer.json").unlink()
    (broken / "tokenizer_config.json").unlink()
    with pytest.raises(ModelNotFoundError, match="no tokenizer files"):
        load_tokenizer(broken)
