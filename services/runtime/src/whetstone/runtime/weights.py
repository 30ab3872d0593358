"""Which kind of weights an artifact holds, read from its file names (pure).

A training artifact is either a PEFT adapter (`adapter_config.json` + `adapter_model.safetensors`) or
full weights (a full fine-tune or continued pre-training): `config.json` with `model.safetensors`, or
the shards `model-00001-of-0000N.safetensors` that `model.safetensors.index.json` maps. Pickled
weights (`*.bin`, `*.pt`) never count: they are neither loaded nor served."""

from __future__ import annotations

import re
from collections.abc import Iterable

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
# what loads a full-weight model beside its weights: the config, the generation settings, the tokenizer
FULL_MODEL_EXTRAS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "special_tokens_map.json", "chat_template.jinja")


def holds_adapter(names: Iterable[str]) -> bool:
    present = set(names)
    return all(f in present for f in ADAPTER_FILES)


def weight_shards(names: Iterable[str]) -> list[str]:
    """The safetensors weight files of a full model, in order: `model.safetensors`, or its shards."""
    present = sorted(set(names))
    if SINGLE_FILE in present:
        return [SINGLE_FILE]
    return [n for n in present if _SHARD.fullmatch(n)]


def holds_full_weights(names: Iterable[str]) -> bool:
    """Full weights and no adapter: config.json plus one safetensors file or a complete set of shards
    (with their index when there are several)."""
    present = set(names)
    if holds_adapter(present) or "config.json" not in present:
        return False
    shards = weight_shards(present)
    if shards == [SINGLE_FILE]:
        return True
    if not shards or SHARD_INDEX not in present:
        return False
    total = int(shards[0].rsplit("-of-", 1)[1].split(".")[0])
    return len(shards) == total


def full_model_files(names: Iterable[str]) -> list[str]:
    """What a reader takes to load the full model: the weights (and index), config, tokenizer, template."""
    present = set(names)
    index = [SHARD_INDEX] if SHARD_INDEX in present and weight_shards(present) != [SINGLE_FILE] else []
    return [*weight_shards(present), *index, *(f for f in FULL_MODEL_EXTRAS if f in present)]
