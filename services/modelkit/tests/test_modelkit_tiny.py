import pytest

pytestmark = pytest.mark.unit


def test_tiny_model_loads_with_auto_classes(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    assert (tiny_model_dir / "model.safetensors").is_file()
    assert model.config.model_type == "llama"
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.vocab_size == len(tokenizer)
    assert 1000 <= len(tokenizer) <= 2000
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.bos_token == "<|bos|>"
    for special in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"):
        assert len(tokenizer(special, add_special_tokens=False)["input_ids"]) == 1
    ids = tokenizer("What is the capital of France?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_chat_template_has_no_generation_markers_and_supports_generation_prompt(tokenizer):
    assert "generation" not in tokenizer.chat_template.replace("add_generation_prompt", "")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|bos|><|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert not tokenizer.apply_chat_template(messages, tokenize=False).endswith("<|assistant|>\n")


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    from whetstone.modelkit.tiny import build_tiny_model

    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    c = build_tiny_model(tmp_path / "c", seed=4)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_cli_writes_model(tmp_path):
    from whetstone.modelkit.tiny import main

    assert main([str(tmp_path / "cli"), "--seed", "1"]) == 0
    assert (tmp_path / "cli" / "config.json").is_file()
