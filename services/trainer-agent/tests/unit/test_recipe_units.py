"""Pure parts of the recipes: hyperparameter rules and defaults, batch planning, data format
checks, collators, the loss guard, checkpoint cadence, fault switches."""

from __future__ import annotations

import json

import pytest
from whetstone.trainer_agent.domain.recipe_io import Failed, Progress, Validation
from whetstone.trainer_agent.recipes.attention import segment_bounds
from whetstone.trainer_agent.recipes.callbacks import Cadence, DivergenceGuard
from whetstone.trainer_agent.recipes.data import (
    IGNORE_INDEX,
    PaddedCollator,
    PaddingFreeCollator,
    check_format,
    row_format,
)
from whetstone.trainer_agent.recipes.errors import (
    AmbiguousError,
    UserError,
    is_out_of_memory,
)
from whetstone.trainer_agent.recipes.faults import Faults
from whetstone.trainer_agent.recipes.hyperparams import (
    Hyperparameters,
    halved_batch,
    plan_auto_batch,
    plan_batch,
    rank_for_size,
)
from whetstone.trainer_agent.recipes.metrics import loss_points

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------ hyperparameters


def test_method_and_size_defaults_fill_only_what_the_user_left_out():
    lora = Hyperparameters.parse({}).resolved("lora", 7_000_000_000)
    assert (lora.learning_rate, lora.lora_r, lora.lora_alpha) == (2e-4, 16, 32)
    full = Hyperparameters.parse({}).resolved("full", 7_000_000_000)
    assert full.learning_rate == 2e-5
    mine = Hyperparameters.parse({"learning_rate": 1e-3, "lora_r": 4}).resolved("qlora", 70_000_000_000)
    assert (mine.learning_rate, mine.lora_r, mine.lora_alpha) == (1e-3, 4, 8)  # alpha = 2 x the user's rank
    both = Hyperparameters.parse({"lora_r": 4, "lora_alpha": 4}).resolved("dpo", 10**8)
    assert (both.learning_rate, both.lora_r, both.lora_alpha) == (5e-6, 4, 4)


def test_rank_grows_with_model_size():
    assert [rank_for_size(n) for n in (10**8, 3 * 10**9, 13 * 10**9, 70 * 10**9)] == [8, 16, 32, 64]


@pytest.mark.parametrize(("raw", "needle"), [
    ({"n_epochs": 0}, "n_epochs=0 (must be 1..100)"),
    ({"batch_size": "big"}, "batch_size must be int"),
    ({"packing": "yes"}, "packing must be a boolean"),
    ({"lora_target_modules": [3]}, "lora_target_modules must be a list"),
    ({"divergence_factor": 0.5}, "divergence_factor=0.5"),
    ({"max_oom_retries": 11}, "max_oom_retries=11"),
    ({"learning_rate": float("nan")}, "learning_rate must be float"),
    ({"max_seq_len": 4, "lora_r": 0}, "lora_r=0 (must be 1..1024), max_seq_len=4 (must be 8..131072)"),
])
def test_out_of_range_hyperparameters_are_named(raw, needle):
    with pytest.raises(UserError) as err:
        Hyperparameters.parse(raw)
    assert needle in str(err.value)
    assert err.value.error_class == "user"


def test_new_knobs_parse():
    hp = Hyperparameters.parse({"batch_size": "auto", "packing": False, "lora_target_modules": ["v_proj", "q_proj"],
                                "checkpoint_every_minutes": 0.5, "merge_adapter": True})
    assert hp.batch_size == "auto" and hp.packing is False and hp.merge_adapter is True
    assert hp.lora_target_modules == ("q_proj", "v_proj") and hp.checkpoint_every_minutes == 0.5
    assert Hyperparameters.parse({"lora_target_modules": "all-linear"}).lora_target_modules is None


def test_auto_batch_reaches_the_target_within_the_token_budget():
    assert plan_auto_batch(16, [100] * 50, 4096) == (16, 1)
    assert plan_auto_batch(16, [100] * 95 + [2000] * 5, 4096) == (2, 8)  # the long tail limits the micro-batch
    assert plan_auto_batch(16, [5000] * 10, 4096) == (1, 16)
    micro, accumulation = plan_auto_batch(12, [300] * 10, 4096)
    assert (micro, accumulation) == (8, 2) and micro * accumulation >= 12


def test_out_of_memory_halving_keeps_the_effective_batch():
    hp = Hyperparameters.parse({"batch_size": 8, "gradient_accumulation_steps": 2})
    smaller = halved_batch(hp)
    assert (smaller.batch_size, smaller.gradient_accumulation_steps) == (4, 4)
    odd = halved_batch(Hyperparameters.parse({"batch_size": 3}))
    assert (odd.batch_size, odd.gradient_accumulation_steps) == (1, 3)
    assert halved_batch(Hyperparameters.parse({"batch_size": 1})) is None


def test_plan_batch_adopts_the_resumed_geometry_only_for_the_same_effective_batch():
    hp = Hyperparameters.parse({"batch_size": 8, "gradient_accumulation_steps": 2})
    resumed = plan_batch(hp, [10] * 4, 4096, previous=(2, 8))  # the segment before halved twice after OOM
    assert (resumed.batch_size, resumed.gradient_accumulation_steps) == (2, 8)
    other = plan_batch(hp, [10] * 4, 4096, previous=(2, 4))
    assert (other.batch_size, other.gradient_accumulation_steps) == (8, 2)
    auto = plan_batch(Hyperparameters.parse({"batch_size": "auto", "target_effective_batch": 16}), [], 4096, None)
    assert (auto.batch_size, auto.gradient_accumulation_steps) == (16, 1)  # no lengths: max_seq_len 256 plans


def test_checkpoint_state_names_the_data_position_and_reads_back_its_geometry(tmp_path):
    from types import SimpleNamespace

    from whetstone.trainer_agent.recipes.checkpointing import (
        checkpoint_geometry,
        checkpoint_state,
        write_checkpoint_state,
    )

    hp = Hyperparameters.parse({"batch_size": 2, "gradient_accumulation_steps": 2, "seed": 3})
    state = SimpleNamespace(global_step=13, epoch=1.3, num_input_tokens_seen=999)
    info = checkpoint_state(state, kind="emergency", method="lora", hp=hp, examples_per_epoch=40, train_file="t.jsonl")
    assert info.kind == "emergency" and info.effective_batch == 4
    assert info.data_position.model_dump() == {"epoch_index": 1, "optimizer_steps_into_epoch": 3,
                                               "micro_batches_into_epoch": 6, "examples_into_epoch": 12,
                                               "examples_per_epoch": 40, "shuffle_seed": 3}
    assert checkpoint_geometry(tmp_path) is None
    write_checkpoint_state(tmp_path, info)
    assert checkpoint_geometry(tmp_path) == (2, 2)
    (tmp_path / "whetstone_state.json").write_text("{}")
    assert checkpoint_geometry(tmp_path) is None


def test_out_of_memory_is_recognised_across_backends():
    import torch

    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB"))
    assert not is_out_of_memory(RuntimeError("index out of range in self"))
    failure = AmbiguousError("oom", code="out_of_memory", advice=["lower max_seq_len"]).event()
    assert failure == Failed(error_class="ambiguous", code="out_of_memory", message="oom", advice=["lower max_seq_len"])


# ------------------------------------------------------------------ data


def test_dpo_on_sft_data_and_sft_on_preference_data_are_rejected():
    chat = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    pair = {"prompt": "q", "chosen": "a", "rejected": "b"}
    assert [row_format(r) for r in (chat, pair, {"text": "t"}, [1])] == ["chat", "preference", "text", None]
    with pytest.raises(UserError, match="line 2: method 'dpo' needs preference rows but this is a chat row"):
        check_format([(1, pair), (2, chat)], "dpo", "d.jsonl")
    with pytest.raises(UserError, match="fits method dpo or orpo"):
        check_format([(1, pair)], "lora", "d.jsonl")
    with pytest.raises(UserError, match="needs text rows"):
        check_format([(4, chat)], "cpt", "d.jsonl")
    check_format([(1, chat)], "full", "d.jsonl")


def test_padding_free_collator_resets_positions_and_cuts_targets_at_boundaries():
    features = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "line": 3},
                {"input_ids": [8, 9], "labels": [8, 9], "line": 9}]
    batch = PaddingFreeCollator()(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7, IGNORE_INDEX, 9]]  # 7 never predicts 8
    assert batch["example_lines"].tolist() == [3, 9] and "attention_mask" not in batch
    assert segment_bounds(batch["position_ids"]) == [0, 3, 5]


def test_padded_collator_counts_the_padding():
    collator = PaddedCollator(pad_id=0)
    batch = collator([{"input_ids": [5, 6, 7, 8], "labels": [5, 6, 7, 8], "line": 1},
                      {"input_ids": [9], "labels": [9], "line": 2}])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 0, 0, 0]]
    assert batch["labels"].tolist()[1] == [9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    assert collator.counter.non_padding_fraction == pytest.approx(5 / 8)


# ------------------------------------------------------------------ loss guard, cadence, faults


def test_guard_stops_on_nan_and_on_sustained_divergence_only():
    guard = DivergenceGuard(factor=4.0, patience=3)
    assert [guard.check(s, loss) for s, loss in enumerate([8.0, 5.0, 2.0, 2.5, 9.0, 2.1])] == [None] * 6
    assert guard.check(7, 9.0) is None and guard.check(8, 9.5) is None
    assert "diverged at step 9" in guard.check(9, 12.0)
    assert "loss became nan at step 3" in DivergenceGuard(4.0, 3).check(3, float("nan"))
    assert "inf" in DivergenceGuard(0, 3).check(1, float("inf"))
    off = DivergenceGuard(factor=0, patience=1)
    assert [off.check(s, loss) for s, loss in enumerate([1.0, 50.0, 80.0])] == [None] * 3


def test_checkpoint_cadence_is_steps_or_minutes_whichever_first():
    cadence = Cadence(every_steps=50, every_minutes=10)
    assert cadence.due(50, 1.0) and cadence.due(7, 601.0)
    assert not cadence.due(49, 599.0)
    assert not Cadence(0, 0).due(50, 10_000)


def test_faults_are_inert_unless_switched_on(monkeypatch):
    monkeypatch.delenv("WHETSTONE_RECIPE_FAULTS", raising=False)
    assert not Faults.from_env().active and Faults.from_env().poison(100) is None
    monkeypatch.setenv("WHETSTONE_RECIPE_FAULTS", json.dumps({"oom_forwards": 2, "poison_line": 4}))
    faults = Faults.from_env()
    assert faults.active and faults.oom_forwards == 2
    assert faults.poison(100)([1, 2], 4) == [107, 2]
    assert faults.poison(100)([1, 2], 5) == [1, 2]


def test_loss_points_keep_the_last_value_per_step():
    progress = [Progress(step=1, loss=3.0), Progress(step=2, loss=2.0, validation=Validation(loss=2.5)),
                Progress(step=2, loss=1.9)]
    assert loss_points(progress) == ([(1, 3.0), (2, 1.9)], [(2, 2.5)])


class _Planted:
    """Unpickling this calls os.mkdir(marker): the stand-in for a planted checkpoint's payload."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.mkdir, (self.marker,)


def _hf_checkpoint(root):
    import numpy as np
    import torch

    root.mkdir(parents=True)
    torch.save({"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
               root / "optimizer.pt")
    torch.save({"python": (3, (1, 2), None), "numpy": ("MT19937", np.arange(4, dtype=np.uint32), 0, 0, 0.0),
                "cpu": torch.ByteTensor([1, 2])}, root / "rng_state.pth")
    torch.save({"args": "a pickled TrainingArguments"}, root / "training_args.bin")
    return root


def test_resume_pickles_must_load_without_running_code(tmp_path):
    import torch
    from whetstone.trainer_agent.recipes.errors import PlatformError
    from whetstone.trainer_agent.recipes.safe_load import verify_checkpoint_pickles

    good = _hf_checkpoint(tmp_path / "good")
    checked = verify_checkpoint_pickles(good)
    assert {p.name for p in checked} == {"optimizer.pt", "rng_state.pth"}
    assert not (good / "training_args.bin").exists()  # never loaded on resume: not kept either

    marker = tmp_path / "pwned"
    for protocol in (2, 4):  # GLOBAL and STACK_GLOBAL opcodes
        bad = _hf_checkpoint(tmp_path / f"bad-{protocol}")
        torch.save({"state": _Planted(str(marker))}, bad / "optimizer.pt", pickle_protocol=protocol)
        with pytest.raises(PlatformError, match="optimizer.pt does not load without running code") as caught:
            verify_checkpoint_pickles(bad)
        assert caught.value.code == "unsafe_checkpoint" and not marker.exists()


def test_deepspeed_states_admit_deepspeed_objects_but_nothing_else(tmp_path):
    import torch
    from whetstone.trainer_agent.recipes.errors import PlatformError
    from whetstone.trainer_agent.recipes.safe_load import verify_checkpoint_pickles

    loss_scaler = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
    root = _hf_checkpoint(tmp_path / "ds")
    step = root / "global_step5"
    step.mkdir()
    torch.save({"module": {"w": torch.zeros(2, 2)}, "ds_version": "0.19", "param_shapes": [{"w": torch.Size([2, 2])}],
                "dtype": torch.bfloat16}, step / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"loss_scaler": loss_scaler.DynamicLossScaler(2.0 ** 16, 1000, 1.0, 2, True),
                                         "partition_count": [1], "step_set": {1, 2}}},
               step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert len(verify_checkpoint_pickles(root)) == 4  # DeepSpeed itself loads these with weights_only=False

    marker = tmp_path / "pwned"
    torch.save({"optimizer_state_dict": {"x": _Planted(str(marker))}}, step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(PlatformError, match="global posix.mkdir is not admitted"):
        verify_checkpoint_pickles(root)
    assert not marker.exists()


# ------------------------------------------------------------------ full weights in shards


def test_full_weights_are_resharded_to_the_operator_size_and_load_back_equal(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.weights import holds_full_weights, weight_shards
    from whetstone.trainer_agent.recipes.checkpointing import reshard_full_weights

    build_tiny_model(tmp_path)
    before = load_file(tmp_path / "model.safetensors")
    shards = reshard_full_weights(tmp_path, 300_000)   # the tiny model is ~875 kB: at least 3 shards
    names = [p.name for p in tmp_path.iterdir()]
    assert len(shards) >= 3 and shards == weight_shards(names) and "model.safetensors" not in names, names
    assert all((tmp_path / s).stat().st_size <= 300_000 for s in shards)
    assert holds_full_weights(names), names
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    after = model.state_dict()
    assert all(torch.equal(after[k], t) for k, t in before.items()), "a tensor changed in the shards"
    assert reshard_full_weights(tmp_path, 300_000) == [], "sharded weights are left as they are"


def test_an_adapter_is_never_resharded(tmp_path):
    from whetstone.trainer_agent.recipes.checkpointing import reshard_full_weights

    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    assert reshard_full_weights(tmp_path, 10) == []
    assert (tmp_path / "model.safetensors").read_bytes() == b"not read"
