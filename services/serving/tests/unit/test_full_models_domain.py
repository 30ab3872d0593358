"""Full-weight models in serving: which versions are full weights (a single safetensors file or a complete
set of shards, never an adapter or a pickle), the 409 naming the budget and the vLLM handoff, and which
resident models are unloaded (least recently used, never one in use) to make room."""

import pytest

from whetstone.contracts.enums import ModelStage
from whetstone.runtime.weights import full_model_files, holds_full_weights, weight_shards
from whetstone.serving.domain.catalog import ModelNotDeployed, ModelVersion, StoredCheckpoint, checkpoint_version
from whetstone.serving.domain.full_models import MIB, is_full_weights, over_budget, to_evict

pytestmark = pytest.mark.unit
SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]


def version(files: list[str]) -> ModelVersion:
    return ModelVersion(model_id="wsm-1", tenant_id="t", name="n", stage=ModelStage.STAGING,
                        files={f: "0" * 64 for f in files}, fine_tuned_model="ft:tiny-llama:t:full:abc")


def test_full_weights_are_a_single_file_or_every_shard_with_its_index():
    assert holds_full_weights(["config.json", "model.safetensors", "tokenizer.json"])
    assert holds_full_weights(["config.json", "model.safetensors.index.json", *SHARDS])
    assert not holds_full_weights(["config.json", "model.safetensors.index.json", *SHARDS[:2]])   # one missing
    assert not holds_full_weights(["config.json", *SHARDS])                                        # no index
    assert not holds_full_weights(["config.json", "pytorch_model.bin"])                           # a pickle
    assert not holds_full_weights(["model.safetensors"])                                          # no config
    assert not holds_full_weights(["adapter_config.json", "adapter_model.safetensors", "config.json",
                                   "model.safetensors"])                                          # an adapter
    assert weight_shards(["config.json", "model.safetensors.index.json", *reversed(SHARDS)]) == SHARDS
    assert full_model_files(["optimizer.pt", "config.json", "model.safetensors.index.json", "README.md",
                             "tokenizer.json", *SHARDS]) == [*SHARDS, "model.safetensors.index.json",
                                                              "config.json", "tokenizer.json"]
    assert is_full_weights(version(["config.json", "model.safetensors"]))
    assert not is_full_weights(version(["adapter_config.json", "adapter_model.safetensors"]))


def test_a_model_over_the_budget_is_a_409_naming_the_setting_and_the_vllm_handoff():
    v = version(["config.json", "model.safetensors"])
    assert over_budget(v, 100 * MIB, 100 * MIB) is None
    refused = over_budget(v, 300 * MIB, 100 * MIB)
    assert refused is not None and (refused.status, refused.code, refused.param) == (
        409, "model_exceeds_serving_budget", "model")
    for words in ("ft:tiny-llama:t:full:abc", "300.0 MiB", "100.0 MiB", "WHETSTONE_SERVING_FULL_MODEL_BUDGET_MB",
                  "vLLM", "whetstone_vllm.json"):
        assert words in refused.message, (words, refused.message)


def test_room_is_made_least_recently_used_first_and_never_from_a_model_in_use():
    resident = {"a": 40, "b": 30, "c": 20}   # LRU order
    assert to_evict(resident, set(), 10, 100) == []
    assert to_evict(resident, set(), 30, 100) == ["a"]
    assert to_evict(resident, {"a"}, 30, 100) == ["b"]
    assert to_evict(resident, {"a", "b"}, 60, 100) is None   # only c may go: still no room


def test_a_checkpoint_of_a_full_weight_model_is_refused_naming_the_model_to_call():
    parent = version(["config.json", "model.safetensors"])
    with pytest.raises(ModelNotDeployed, match="full-weight model `ft:tiny-llama:t:full:abc`: .*final weights only"):
        checkpoint_version(parent, "ft:tiny-llama:t:full:abc:ckpt-step-5", 5, StoredCheckpoint("s3://b/c", "0" * 64))
