"""Packing without cross-example attention: a packed row scores each example exactly as
that example alone does (the sanity check of Kundu et al. 2024), and packed training
follows the padded loss curve."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn import functional
from whetstone.devstack.recipe_harness import run_in_process
from whetstone.trainer_agent.domain.recipe_io import TrainingConfig
from whetstone.trainer_agent.recipes import attention
from whetstone.trainer_agent.recipes.data import (
    IGNORE_INDEX,
    PaddedCollator,
    PaddingFreeCollator,
    read_chat_jsonl,
    tokenize_chat_rows,
)

pytestmark = pytest.mark.integration


def _masked_mean(logits, labels):
    """Mean next-token loss over the labelled targets (logits[t] predicts labels[t+1])."""
    losses = functional.cross_entropy(logits[:-1].float(), labels[1:], ignore_index=IGNORE_INDEX, reduction="none")
    mask = labels[1:] != IGNORE_INDEX
    return losses[mask].sum() / mask.sum()


@pytest.fixture(scope="module")
def examples(tiny_base, data_files):
    from whetstone.modelkit.loading import load_tokenizer

    rows = read_chat_jsonl(data_files["train"])[:12]
    return tokenize_chat_rows(load_tokenizer(tiny_base), rows, 256, "train.jsonl")


@pytest.mark.parametrize("implementation", [attention.NAME, "sdpa"])
def test_packed_row_losses_equal_one_by_one(tiny_base, examples, implementation):
    from whetstone.modelkit.loading import load_model

    attention.register()
    alone_model = load_model(tiny_base, dtype="float32").eval()
    packed_model = load_model(tiny_base, dtype="float32", attn_implementation=implementation).eval()
    batch = PaddingFreeCollator()([e.as_row() for e in examples])
    assert batch["input_ids"].shape == (1, sum(len(e.input_ids) for e in examples))  # no padding at all
    with torch.no_grad():
        # use_cache=False as in training: with a KV cache, stock sdpa does not derive the block-diagonal
        # mask from position_ids and packed examples would see each other
        logits = packed_model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                              use_cache=False).logits[0]
        alone = [_masked_mean(alone_model(input_ids=torch.tensor([e.input_ids])).logits[0],
                              torch.tensor(e.labels)) for e in examples]
    packed, start = [], 0
    for e in examples:
        end = start + len(e.input_ids)
        packed.append(_masked_mean(logits[start:end], batch["labels"][0, start:end]))
        start = end
    torch.testing.assert_close(torch.stack(packed), torch.stack(alone), rtol=1e-5, atol=1e-6)


def test_padded_batch_losses_equal_one_by_one(tiny_base, examples):
    from whetstone.modelkit.loading import load_model, load_tokenizer

    model = load_model(tiny_base, dtype="float32").eval()
    batch = PaddedCollator(load_tokenizer(tiny_base).pad_token_id)([e.as_row() for e in examples])
    assert batch["input_ids"].shape[0] == len(examples)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        alone = [_masked_mean(model(input_ids=torch.tensor([e.input_ids])).logits[0], torch.tensor(e.labels))
                 for e in examples]
    padded = [_masked_mean(logits[i, : len(e.input_ids)], batch["labels"][i, : len(e.input_ids)])
              for i, e in enumerate(examples)]
    torch.testing.assert_close(torch.stack(padded), torch.stack(alone), rtol=1e-5, atol=1e-6)


def test_packed_training_follows_the_padded_loss_curve(tiny_base, data_files, tmp_path):
    hyperparameters = {"n_epochs": 1, "learning_rate": 1e-2, "batch_size": 4, "lora_r": 4, "lora_dropout": 0.0,
                       "max_seq_len": 256, "seed": 0, "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0}
    runs = {}
    for packing in (True, False):
        config = TrainingConfig(job_id=f"pack-{packing}", base_model=str(tiny_base), train_file=data_files["train"],
                                output_dir=tmp_path / f"out-{packing}", method="lora",
                                hyperparameters={**hyperparameters, "packing": packing})
        runs[packing] = run_in_process(config, tmp_path)
        assert runs[packing].returncode == 0, runs[packing].events[-1]
    packed, padded = runs[True], runs[False]
    assert packed.completed.outcome.non_padding_fraction == 1.0 and padded.completed.outcome.non_padding_fraction < 0.9
    steps = sorted(packed.losses())
    assert steps == sorted(padded.losses()) == list(range(1, 11))
    torch.testing.assert_close(torch.tensor([packed.losses()[s] for s in steps]),
                               torch.tensor([padded.losses()[s] for s in steps]), rtol=1e-4, atol=1e-5)
    summary = json.loads((tmp_path / "out-True" / "final" / "whetstone_training.json").read_text())
    assert summary["hyperparameters"]["packing"] is True
