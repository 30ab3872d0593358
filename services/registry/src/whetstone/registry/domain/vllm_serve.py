"""How a vLLM server must run to serve an adapter the registry hands over: `vllm serve` arguments
and environment, with the multimodal settings a vision adapter needs. Pure.

For every adapter: `--enable-lora`, `--max-lora-rank` at least the adapter's rank (vLLM's default
is 16), and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` for the runtime load/unload endpoints the
handoff calls. For a vision adapter (its lineage holds `VisionSettings`) also:

- `--limit-mm-per-prompt '{"image": N, "video": 0}'`: at most N images per request (the platform's
  10 per example, as ingest and serving), no video;
- `--chat-template <dir>/chat_template.jinja`: the template the adapter was trained with, which
  writes each image as the processor's image token (`image_token` in the lineage);
- the base's own processor (vLLM reads it from the base model's directory; the adapter's
  processor config files, laid out beside it, are the ones training used, to compare).

vLLM fetches `http(s)://` image URLs itself; the platform's own serving refuses them unless the
operator allows fetching. This handoff sets no media-fetching option: restricting what a vLLM
fleet may fetch is the operator's (its network policy and vLLM's media options).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .lineage import VisionSettings

IMAGES_PER_PROMPT = 10
SERVE_FILE = "whetstone_vllm.json"
TEMPLATE_FILE = "chat_template.jinja"
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@dataclass(frozen=True)
class VllmServe:
    """`vllm serve` settings for one handed-over adapter (written beside it as whetstone_vllm.json)."""

    base_model: str
    max_lora_rank: int
    vision: bool
    limit_mm_per_prompt: dict[str, int] | None = None
    chat_template: str | None = None          # a path vLLM reads
    image_token: str | None = None
    processor_class: str | None = None
    env: dict[str, str] = field(default_factory=lambda: {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})

    def args(self) -> list[str]:
        out = [self.base_model, "--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
        if self.limit_mm_per_prompt is not None:
            out += ["--limit-mm-per-prompt", json.dumps(self.limit_mm_per_prompt, separators=(",", ":"))]
        if self.chat_template is not None:
            out += ["--chat-template", self.chat_template]
        return out

    def document(self) -> dict[str, Any]:
        """What whetstone_vllm.json holds: the command line, the environment and the settings by name."""
        return {"command": ["vllm", "serve", *self.args()], "env": dict(self.env), "base_model": self.base_model,
                "max_lora_rank": self.max_lora_rank, "vision": self.vision,
                "limit_mm_per_prompt": self.limit_mm_per_prompt, "chat_template": self.chat_template,
                "image_token": self.image_token, "processor_class": self.processor_class}


def lora_rank(adapter_config: dict[str, Any]) -> int:
    """The adapter's LoRA rank, at least vLLM's default of 16 (a server runs with one max for all)."""
    r = adapter_config.get("r")
    return max(16, int(r)) if isinstance(r, int) else 16


def vllm_serve(base_model: str, adapter_config: dict[str, Any], vision: VisionSettings | None, *,
               chat_template: str | None = None, images_per_prompt: int = IMAGES_PER_PROMPT) -> VllmServe:
    """The settings a vLLM server needs for this adapter; the multimodal ones when it was trained on images."""
    rank = lora_rank(adapter_config)
    if vision is None:
        return VllmServe(base_model=base_model, max_lora_rank=rank, vision=False)
    return VllmServe(base_model=base_model, max_lora_rank=rank, vision=True,
                     limit_mm_per_prompt={"image": images_per_prompt, "video": 0}, chat_template=chat_template,
                     image_token=vision.image_token, processor_class=vision.processor_class)


@dataclass(frozen=True)
class VllmServeFull:
    """`vllm serve` settings for a full-weight model (a full fine-tune or continued pre-training): a server
    of its own that loads the laid-out directory as its model (vLLM swaps LoRA adapters at runtime, never
    whole models), under the model's public name."""

    model_dir: str
    served_model_name: str
    base_model: str

    def args(self) -> list[str]:
        return [self.model_dir, "--served-model-name", self.served_model_name]

    def document(self) -> dict[str, Any]:
        return {"command": ["vllm", "serve", *self.args()], "env": {}, "full_weights": True,
                "model_dir": self.model_dir, "served_model_name": self.served_model_name,
                "fine_tuned_from": self.base_model, "enable_lora": False}
