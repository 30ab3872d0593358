"""The tiny LLaVA builds offline with its processor, and LoRA on its language model learns from image
chats on the CPU with the platform's mask (vision tower frozen, image tokens never trained)."""

from __future__ import annotations

import base64
import io

import pytest

pytestmark = pytest.mark.integration


def _chat(colour: str) -> list[dict]:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 40), colour).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "text", "text": "What colour?"},
                                         {"type": "image_url", "image_url": {"url": url}}]},
            {"role": "assistant", "content": colour}]


def test_tiny_vlm_trains_lora_on_image_chats(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from whetstone.modelkit import vision
    from whetstone.modelkit.tiny_vision import IMAGE_SEQ_LENGTH, build_tiny_vision_model

    path = build_tiny_vision_model(tmp_path / "tiny-llava", seed=0)
    assert vision.is_vision_model(path) and not vision.is_vision_model(tmp_path)
    processor = vision.load_processor(path)
    examples = [vision.vision_example(processor, _chat(c)) for c in ("red", "blue", "red", "blue")]
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    first = examples[0]
    assert first.input_ids.count(image_id) == IMAGE_SEQ_LENGTH == 16
    trained = [t for t, lab in zip(first.input_ids, first.labels) if lab != -100]
    assert image_id not in trained and processor.tokenizer.decode(trained).startswith("red")
    assert tuple(first.pixel_values.shape) == (1, 3, 32, 32)

    # the loader text users share (the eval gate, judges) loads the whole VLM: its language side answers text
    from whetstone.modelkit.loading import load_model

    whole = load_model(path, dtype="float32")
    assert vision.is_vision_config(whole.config)
    assert tuple(whole(input_ids=torch.tensor([[1, 2, 3]])).logits.shape[:2]) == (1, 3)

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(path)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=vision.language_lora_targets()))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("language_model" in n and "lora_" in n for n in names)   # vision tower frozen
    batch = vision.VisionCollator(processor.tokenizer.pad_token_id)(examples)
    assert batch["pixel_values"].shape[0] == 4
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    losses = []
    for _ in range(8):
        loss = model(**batch).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.8, losses
