"""The `vllm serve` settings the handoff names for an adapter: LoRA always, multimodal for a vision adapter."""

import pytest

from whetstone.registry.domain.lineage import VisionSettings
from whetstone.registry.domain.vllm_serve import vllm_serve

pytestmark = pytest.mark.unit
VISION = VisionSettings(processor_class="LlavaProcessor", image_processor_class="CLIPImageProcessor",
                        image_token="<image>", patch_size=8, crop_size={"height": 32, "width": 32}, tokens_per_image=16,
                        vision_tower="frozen")


def test_text_adapter_needs_lora_only():
    serve = vllm_serve("org/base", {"r": 8}, None)
    assert serve.args() == ["org/base", "--enable-lora", "--max-lora-rank", "16"]   # vLLM's default floor
    assert serve.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert vllm_serve("org/base", {"r": 64}, None).max_lora_rank == 64


def test_vision_adapter_names_the_multimodal_settings():
    serve = vllm_serve("llava-hf/llava-1.5-7b-hf", {"r": 32}, VISION, chat_template="/loras/m/chat_template.jinja",
                       images_per_prompt=4)
    assert serve.args() == ["llava-hf/llava-1.5-7b-hf", "--enable-lora", "--max-lora-rank", "32",
                            "--limit-mm-per-prompt", '{"image":4,"video":0}',
                            "--chat-template", "/loras/m/chat_template.jinja"]
    doc = serve.document()
    assert doc["command"][:2] == ["vllm", "serve"] and doc["image_token"] == "<image>"
    assert doc["processor_class"] == "LlavaProcessor" and doc["vision"] is True
    assert VISION.tower_image_size == (32, 32) and VISION.view().image_size == [32, 32]


def test_a_full_weight_model_is_laid_out_for_a_vllm_server_of_its_own(tmp_path):
    import json

    from whetstone.registry.adapters.vllm import lay_out_full_model
    from whetstone.registry.domain.vllm_serve import SERVE_FILE

    source = tmp_path / "src"
    source.mkdir()
    for name in ("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                 "model.safetensors.index.json", "tokenizer.json"):
        (source / name).write_text("{}")
    target = lay_out_full_model(tmp_path / "models", "wsm-1", source, "ft:tiny-llama:t:full:abc", "tiny-llama")
    doc = json.loads((target / SERVE_FILE).read_text())
    assert doc["command"] == ["vllm", "serve", str(target), "--served-model-name", "ft:tiny-llama:t:full:abc"]
    assert doc["full_weights"] is True and doc["enable_lora"] is False and doc["fine_tuned_from"] == "tiny-llama"
    assert (target / "model-00002-of-00002.safetensors").is_file() and (target / "config.json").is_file()
    (source / "model-00001-of-00002.safetensors").unlink()
    (source / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="no safetensors"):
        lay_out_full_model(tmp_path / "models", "wsm-2", source, "x", "tiny-llama")
