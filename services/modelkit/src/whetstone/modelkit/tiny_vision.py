"""A tiny, random-init LLaVA-style vision-language model, built offline like `tiny.py`'s Llama.

    LlavaForConditionalGeneration
      vision tower: CLIPVisionModel, 32 x 32 images in 8 x 8 patches (16 patches + CLS)
      projector:    2-layer MLP, vision hidden -> text hidden
      language:     the same tiny Llama as `tiny.py` (2 layers, hidden 64)
    LlavaProcessor
      CLIPImageProcessor (resize the short side to 32, centre-crop 32 x 32, CLIP mean/std)
      the local byte-level BPE tokenizer of `tiny.py` plus an `<image>` special token

The processor expands each `<image>` into 16 image tokens (4 x 4 patches; the CLS feature is
dropped, `vision_feature_select_strategy="default"`). The chat template reads a content that
is a string or a list of parts ({"type": "text"}, {"type": "image"} or OpenAI's
{"type": "image_url"}), so both the processor's chat template and the platform's text
rendering work; like `tiny.py`'s, it has no `{% generation %}` markers.

The files are those of a Hub LLaVA checkpoint (`config.json`, `model.safetensors`,
`tokenizer*.json`, `processor_config.json`, `chat_template.jinja`, ...): any Hugging Face VLM
directory with a processor loads through the same code.

    python -m whetstone.modelkit.tiny_vision OUT_DIR [--seed N]
"""

from __future__ import annotations

from pathlib import Path

from .tiny import END_OF_TURN, build_cli, build_tokenizer, tiny_llama_config, write_tiny_model

IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH_SIZE = 32, 8
IMAGE_SEQ_LENGTH = (IMAGE_SIZE // PATCH_SIZE) ** 2

VISION_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('Unsupported role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ['image', 'image_url'] -%}{{- '" + IMAGE_TOKEN + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def build_vision_processor():
    """The CLIP image processor + the tiny tokenizer with the image token, as a LlavaProcessor."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", chat_template=VISION_CHAT_TEMPLATE,
                          image_token=IMAGE_TOKEN, num_additional_image_tokens=1)


def build_tiny_vision_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Write a tiny random LLaVA + processor to `out_dir`; same seed -> same bytes."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    processor = build_vision_processor()
    tok = processor.tokenizer
    bos_id, eos_id, pad_id, end_id, image_id = tok.convert_tokens_to_ids(
        [tok.bos_token, tok.eos_token, tok.pad_token, END_OF_TURN, IMAGE_TOKEN])
    text = tiny_llama_config(vocab_size=len(tok), bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    vision = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=2, projection_dim=32)
    config = LlavaConfig(text_config=text, vision_config=vision, image_token_index=image_id,
                         vision_feature_select_strategy="default", vision_feature_layer=-1,
                         image_seq_length=IMAGE_SEQ_LENGTH, tie_word_embeddings=False,
                         bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    return write_tiny_model(LlavaForConditionalGeneration, config, processor, out_dir, seed=seed, bos_id=bos_id,
                            eos_id=eos_id, end_id=end_id, pad_id=pad_id)


def main(argv: list[str] | None = None) -> int:
    return build_cli(argv, prog="python -m whetstone.modelkit.tiny_vision", doc=__doc__, what="tiny vision model",
                     build=build_tiny_vision_model)


if __name__ == "__main__":
    raise SystemExit(main())
