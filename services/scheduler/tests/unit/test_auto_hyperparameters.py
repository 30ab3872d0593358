"""'auto' hyperparameters from the data and the model: pure rules."""

import pytest
from whetstone.contracts import Hyperparameters

from whetstone.scheduler.domain import auto
from whetstone.scheduler.domain import jobs as rules
from whetstone.scheduler.domain.job_data import JobResources
from whetstone.scheduler.domain.placement import Shape
from whetstone.scheduler.domain.resources import ModelArch

pytestmark = pytest.mark.unit
TINY = {"params": 2_000_000, "params_source": "config",
        "arch": {"hidden_size": 64, "num_layers": 2, "vocab_size": 512, "max_positions": 1024}}
SEVEN_B = {"params": 7_000_000_000, "params_source": "config",
           "arch": {"hidden_size": 4096, "num_layers": 32, "vocab_size": 32000, "max_positions": 4096}}


def resolve(method="lora", given=None, res=TINY, shapes=(Shape("cpu", 1),), examples=200, tokens=200 * 60):
    """(the set knobs as a dict, the knobs chosen), or the Rejection."""
    given = Hyperparameters(**(given or {}))
    arch = JobResources.model_validate(res).model
    defaults, _ = rules.resolve_hyperparameters(method, given, rules.model_defaults(arch.max_positions))
    got = auto.resolve_for_job(method, given, defaults, arch, shapes, 16.0, auto.DataFacts(examples, tokens))
    return got if isinstance(got, rules.Rejection) else (got[0].model_dump(exclude_none=True), got[1])


def test_epochs_follow_openais_published_rule():
    assert [auto.auto_epochs(n) for n in (10, 24, 33, 34, 1000, 8333, 8334, 30_000, 100_000)] == \
        [10, 4, 3, 3, 3, 3, 2, 1, 1]
    assert auto.auto_epochs(3) == 25   # never more than 25 (only reachable below the 10-example floor)


def test_batch_grows_with_the_data_within_8_and_256():
    assert [auto.auto_batch(n) for n in (10, 1000, 4000, 10_000, 50_000, 1_000_000)] == [8, 8, 8, 16, 128, 256]


def test_rank_and_alpha_follow_the_base_size_and_learning_rate_the_method():
    hp, chosen = resolve()
    assert (hp["lora_r"], hp["lora_alpha"]) == (16, 32)
    assert hp["learning_rate"] == 2e-3             # 2e-4 for a 2048-wide base, x10 (the cap) for a 64-wide one
    hp7, _ = resolve(res=SEVEN_B, shapes=(Shape("A100", 1),))
    assert (hp7["lora_r"], hp7["lora_alpha"], hp7["learning_rate"]) == (16, 32, 2e-4)
    assert [auto.auto_learning_rate("lora", 2e-4, h) for h in (896, 2048, 8192, None)] == [4.57e-4, 2e-4, 2e-4, 2e-4]
    given, _ = resolve(given={"learning_rate": 1e-4})
    assert given["learning_rate"] == 1e-4          # a rate the user gave (or a multiplier of it) always wins
    assert [auto.rank_for_size(p) for p in (5e8, 13e9, 70e9)] == [16, 32, 64]
    full, chosen_full = resolve("full")
    assert "lora_r" not in full and full["learning_rate"] == 2e-5 and "lora_r" not in chosen_full
    dpo, _ = resolve("dpo")
    assert dpo["learning_rate"] == 5e-6
    assert set(chosen) >= {"n_epochs", "batch_size", "lora_r", "lora_alpha", "learning_rate"}


def test_micro_batch_fits_the_smallest_gpu_and_accumulation_makes_up_the_rest():
    # 50,000 examples -> 128 per step; a 7B LoRA with 1,000-token rows on an 80 GB GPU
    hp, _ = resolve(res=SEVEN_B, shapes=(Shape("A100", 1),), examples=50_000, tokens=50_000 * 500)
    assert hp["batch_size"] * hp["gradient_accumulation_steps"] == 128
    assert (hp["batch_size"], hp["gradient_checkpointing"]) == (8, False)
    # a 24 GB GPU among the shapes: one example fits without checkpointing, eight with it
    small, _ = resolve(res=SEVEN_B, shapes=(Shape("A100", 1), Shape("L4", 1)), examples=50_000, tokens=50_000 * 500)
    assert small["gradient_checkpointing"] is True and 1 < small["batch_size"] <= hp["batch_size"]
    assert small["batch_size"] * small["gradient_accumulation_steps"] == 128
    # a tiny model fits its whole batch without checkpointing
    tiny, _ = resolve(examples=200)
    assert (tiny["batch_size"], tiny["gradient_accumulation_steps"], tiny["gradient_checkpointing"]) == (8, 1, False)


def test_explicit_values_always_win():
    given = {"n_epochs": 2, "batch_size": 4, "lora_r": 32, "learning_rate": 1e-3}
    hp, chosen = resolve(given=given, examples=100_000, tokens=100_000 * 50)
    assert (hp["n_epochs"], hp["batch_size"], hp["lora_r"], hp["learning_rate"]) == (2, 4, 32, 1e-3)
    assert hp["lora_alpha"] == 64 and "gradient_checkpointing" not in hp
    assert not {"n_epochs", "batch_size", "lora_r", "learning_rate"} & set(chosen)


def test_auto_epochs_on_five_examples_is_refused_naming_the_field():
    refused = resolve(examples=5, tokens=300)
    assert isinstance(refused, rules.Rejection) and refused.param == "hyperparameters.n_epochs"
    assert "at least 10" in refused.message and "has 5" in refused.message
    hp, _ = resolve(given={"n_epochs": 3}, examples=5, tokens=300)   # an explicit value trains on them
    assert hp["n_epochs"] == 3


def test_arch_of_reads_the_resources_admission_recorded():
    assert JobResources.model_validate(TINY).model == ModelArch(2_000_000, "config", 64, 2, 512, 1024)
