"""The sizes a model's Hugging Face ``config.json`` gives, under the several names model families use
for them (``hidden_size`` / ``n_embd`` / ``d_model``, ...). Pure: the catalog reads the file, this
reads the document once into typed fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

# families whose MLP has two matrices (up, down) rather than a gated three
UNGATED_FAMILIES = ("gpt2", "gpt_neox", "opt", "bloom", "falcon", "phi")


class VisionConfig(BaseModel):
    """A vision-language model's image tower: only its presence is read."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class HfConfig(BaseModel):
    """The fields of a config.json the memory estimate reads; any other key is ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    model_type: str | None = None
    hidden_size: int | None = None
    n_embd: int | None = None
    d_model: int | None = None
    num_hidden_layers: int | None = None
    n_layer: int | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    num_attention_heads: int | None = None
    n_head: int | None = None
    head_dim: int | None = None
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    n_inner: int | None = None
    num_local_experts: int | None = None
    num_experts: int | None = None
    tie_word_embeddings: bool | None = None
    max_position_embeddings: int | None = None
    n_positions: int | None = None
    text_config: HfConfig | None = None   # a multimodal model's language part
    vision_config: VisionConfig | None = None

    @classmethod
    def parse(cls, document: Mapping[str, Any]) -> HfConfig | None:
        """The config.json document read once; None when a field read here has a value of the wrong type
        (as for an unreadable file: the size then comes from the name or the weights)."""
        try:
            return cls.model_validate(document)
        except ValidationError:
            return None

    @property
    def text(self) -> HfConfig:
        """The language model's sizes: a multimodal model's `text_config` when it gives a hidden size."""
        inner = self.text_config
        return inner if inner is not None and inner.hidden_size else self

    @property
    def sees_images(self) -> bool:
        return self.vision_config is not None

    @property
    def hidden(self) -> int | None:
        return self.hidden_size or self.n_embd or self.d_model

    @property
    def layers(self) -> int | None:
        return self.num_hidden_layers or self.n_layer or self.num_layers

    @property
    def heads(self) -> int | None:
        return self.num_attention_heads or self.n_head

    @property
    def intermediate(self) -> int | None:
        return self.intermediate_size or self.n_inner

    @property
    def experts(self) -> int:
        return self.num_local_experts or self.num_experts or 1

    @property
    def gated(self) -> bool:
        return self.model_type not in UNGATED_FAMILIES

    @property
    def max_positions(self) -> int | None:
        return self.max_position_embeddings or self.n_positions
