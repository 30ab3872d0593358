"""Model size -> memory -> GPU shapes, and runtime estimates."""

import pytest
from whetstone.contracts import Hyperparameters

from whetstone.scheduler.domain.placement import Shape
from whetstone.scheduler.domain.hf_config import HfConfig
from whetstone.scheduler.domain.resources import (
    CPU, ModelArch, arch_from_config, canonical_gpu_type, estimate_runtime_s, explicit_shape_problem, model_arch,
    offers, params_from_name, plan_shapes, training_memory,
)

pytestmark = pytest.mark.unit

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008,
             "vocab_size": 32000, "num_attention_heads": 32, "num_key_value_heads": 32,
             "max_position_embeddings": 4096}
LLAMA3_70B = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "intermediate_size": 28672,
              "vocab_size": 128256, "num_attention_heads": 64, "num_key_value_heads": 8,
              "max_position_embeddings": 8192}
HP = Hyperparameters(batch_size=1, max_seq_len=2048, lora_r=16)


def arch_of(config: dict):
    return arch_from_config(HfConfig.model_validate(config))


CATALOG = offers([], cpu_memory_gb=16, include_catalog=True)


def test_parameter_count_from_config_matches_the_published_sizes():
    assert arch_of(LLAMA2_7B).params == pytest.approx(6.74e9, rel=0.01)
    assert arch_of(LLAMA3_70B).params == pytest.approx(70.6e9, rel=0.01)
    assert arch_of({"model_type": "llama"}) is None
    # a multimodal config's text part is the one sized; a size of the wrong type reads as no config
    llava = HfConfig.parse({"model_type": "llava", "text_config": LLAMA2_7B, "vision_config": {"image_size": 336}})
    assert arch_from_config(llava) == arch_of(LLAMA2_7B) and llava.sees_images
    assert not HfConfig.parse(LLAMA2_7B).sees_images
    assert HfConfig.parse({**LLAMA2_7B, "hidden_size": "big"}) is None


@pytest.mark.parametrize("name,params", [
    ("meta-llama/Llama-3-70B-Instruct", 70e9), ("Qwen2.5-0.5B", 0.5e9), ("mistralai/Mixtral-8x7B-v0.1", 56e9),
    ("HuggingFaceTB/SmolLM-135M", 135e6), ("tiny-llama", None), ("gpt2", None),
])
def test_size_hint_in_the_model_name(name, params):
    assert params_from_name(name) == params


def test_size_falls_back_from_config_to_name_to_weight_bytes():
    assert model_arch("x-7b", HfConfig.parse(LLAMA2_7B), None).source == "config"
    assert model_arch("llama-70b", HfConfig(model_type="llama"), 10).params == 70e9
    fake = model_arch("pinned-model", HfConfig(model_type="llama"), 10)
    assert (fake.source, fake.params) == ("weights", 5)


def test_memory_math_follows_bytes_per_parameter():
    arch = ModelArch(7_000_000_000, "name")
    full = training_memory(arch, "full", HP)
    assert full.sharded == pytest.approx(16 * 7e9 / 1024 ** 3)            # ~104 GiB = 112 GB
    lora = training_memory(arch, "lora", HP)
    assert lora.weights == pytest.approx(2 * 7e9 / 1024 ** 3) and lora.adapter < 1.0
    qlora = training_memory(arch, "qlora", HP)
    assert qlora.weights == pytest.approx(0.53 * 7e9 / 1024 ** 3)
    assert full.total > lora.total > qlora.total
    bigger_batch = training_memory(arch, "lora", HP.model_copy(update={"batch_size": 8}))
    assert bigger_batch.activations == pytest.approx(8 * lora.activations)


def test_auto_shapes_for_the_issue_job_sizes():
    def first(config, method, hp=HP):
        return plan_shapes(arch_of(config), method, hp, CATALOG, 200_000_000).shapes

    lora_7b = first(LLAMA2_7B, "lora")
    assert Shape("A100", 1, 1) in lora_7b and all(s.nodes == 1 for s in lora_7b)
    assert Shape("H100", 4, 1) in first(LLAMA3_70B, "lora")                 # 140 GB of weights + activations
    # 1.1 TB of weights, gradients and Adam state sharded (ZeRO-3): 16 H100s at micro-batch 1 (the
    # article's figure), 32 once micro-batch 8 adds its activations on every GPU
    full_70b = [s for s in first(LLAMA3_70B, "full") if s.gpu_type == "H100"]
    assert full_70b == [Shape("H100", 8, 2)]
    full_70b = [s for s in first(LLAMA3_70B, "full", HP.model_copy(update={"batch_size": 8})) if s.gpu_type == "H100"]
    assert full_70b == [Shape("H100", 8, 4)]
    assert Shape("A100", 1, 1) in first(LLAMA3_70B, "qlora", HP)


def test_tiny_models_get_the_cpu_node_big_ones_do_not():
    pool = offers([("cpu", 0.0, 1)], cpu_memory_gb=16, include_catalog=False)
    tiny = plan_shapes(ModelArch(5, "weights"), "lora", HP, pool, 200_000_000)
    assert tiny.shapes == (Shape(CPU, 1, 1),)
    big = plan_shapes(arch_of(LLAMA2_7B), "lora", HP, pool, 200_000_000)
    assert big.shapes == () and "too large to train on CPU" in big.refused[CPU]


def test_a_job_too_big_for_every_gpu_is_refused_with_reasons():
    huge = ModelArch(2_000_000_000_000, "name")          # 2T parameters, full fine-tune
    plan = plan_shapes(huge, "full", HP, CATALOG, 200_000_000)
    assert plan.shapes == () and "H100" in plan.refused and "16 nodes" in plan.refused["H100"]


def test_explicit_request_checked_against_memory():
    memory = training_memory(arch_of(LLAMA3_70B), "full", HP)
    problem = explicit_shape_problem(Shape("A100", 1, 1), memory, CATALOG)
    assert problem and "GB per GPU" in problem
    assert explicit_shape_problem(Shape("H100", 8, 4), memory, CATALOG) is None
    assert "not offered" in explicit_shape_problem(Shape("TPUv5", 1, 1), memory, CATALOG)


@pytest.mark.parametrize("label,name", [("NVIDIA-A100-SXM4-80GB", "A100"), ("NVIDIA-A100-PCIE-40GB", "A100-40GB"),
                                        ("NVIDIA-H100-80GB-HBM3", "H100"), ("nvidia-tesla-t4", "T4"),
                                        ("nvidia-l4", "L4"), ("cpu", "cpu"), ("MI300X", "MI300X")])
def test_gpu_labels_are_canonical(label, name):
    assert canonical_gpu_type(label) == name


def test_runtime_estimate_scales_with_tokens_and_gpus():
    arch = ModelArch(7_000_000_000, "name")
    one = estimate_runtime_s(arch, "lora", 10_000_000, 1, Shape("A100", 1), 312)
    two = estimate_runtime_s(arch, "lora", 10_000_000, 1, Shape("A100", 2), 312)
    assert one == pytest.approx(2 * two) and 1800 < one < 4 * 3600     # 10M tokens of 7B LoRA: about an hour
    assert estimate_runtime_s(arch, "lora", None, 1, Shape("A100", 1), 312, default_s=123) == 123
