"""Reinforcement fine-tuning on the tiny Llama (trl GRPOTrainer + LoRA, in process, CPU): the grader
is the reward, progress events carry reward mean/std and the multi grader's sub-rewards,
checkpoints and every eval_interval steps carry the validation reward, a resumed run continues with
the same prompts and samples, RFT data the grader cannot read is refused before any model is loaded,
naming the lines, and QLoRA (a 4-bit NF4 base) trains on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from whetstone.devstack.recipe_harness import run_in_process, write_jsonl
from whetstone.graders.rft import parse_method
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    Completed,
    Failed,
    Progress,
    RecipeReinforcement,
    Started,
    TrainingConfig,
)

pytestmark = pytest.mark.integration

# fuzzy_match against a fixed string: a continuous score, so sampled completions of even a random
# model differ in reward from the first step (a binary reward would often give a group zero variance)
GRADER = {"type": "multi", "name": "reward", "calculate_output": "0.5 * close + 0.5 * short", "graders": {
    "close": {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
              "reference": "{{item.target}}", "evaluation_metric": "fuzzy_match"},
    "short": {"type": "text_similarity", "name": "short", "input": "{{sample.output_text}}",
              "reference": "{{item.target}}", "evaluation_metric": "rouge_1"}}}


def rows(n: int, **extra) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Tell me about the number {i}."}], "target": "yes yes yes",
             **extra} for i in range(n)]


def config(base: Path, root: Path, train: list[dict], validation: list[dict] | None = None, *,
           checkpoint_every_steps: int = 2, **reinforcement) -> TrainingConfig:
    plan = parse_method({"grader": GRADER, "hyperparameters": {"batch_size": 1, "n_epochs": 1, "eval_interval": 3,
                                                               "compute_multiplier": 0.5}}).record()
    plan.update(max_completion_tokens=8, learning_rate=5e-3, **reinforcement)
    return TrainingConfig(job_id="job-rft", base_model=str(base), train_file=write_jsonl(train, root / "train.jsonl"),
                          validation_file=write_jsonl(validation, root / "val.jsonl") if validation else None,
                          output_dir=root / "out", method="reinforcement",
                          hyperparameters={"seed": 0, "checkpoint_every_steps": checkpoint_every_steps,
                                           "max_seq_len": 128},
                          reinforcement=RecipeReinforcement(**plan))


def test_grpo_trains_with_the_grader_as_reward_and_resumes_exactly(tiny_base, tmp_path):
    run = run_in_process(config(tiny_base, tmp_path, rows(4), rows(2)), tmp_path)
    assert run.returncode == 0, run.last
    progress = run.of(Progress)
    assert [p.step for p in progress] == [1, 2, 3, 4]
    for p in progress:
        assert 0.0 <= p.reward <= 1.0 and p.reward_std >= 0.0 and p.grader_errors == 0
        assert p.reward == pytest.approx(0.5 * p.sub_rewards["close"] + 0.5 * p.sub_rewards["short"], abs=1e-6)
    assert any(p.reward_std > 0 for p in progress)   # the reward varies: GRPO has an advantage to follow
    # the validation prompts are graded at each checkpoint (step 2) and every eval_interval (3) steps
    assert [p.step for p in progress if p.validation is not None] == [2, 3]
    assert 0.0 <= progress[2].validation.reward <= 1.0 and progress[2].validation.samples == 2
    periodic = [c for c in run.of(Checkpoint) if c.kind == "periodic"]
    assert periodic and all(0.0 <= c.validation.reward <= 1.0 for c in periodic)
    final = Path(run.of(Checkpoint)[-1].path)
    assert (final / "adapter_config.json").is_file() and (final / "adapter_model.safetensors").is_file()
    done = run.of(Completed)[0]
    assert done.outcome.generations == 2 and 0.0 <= done.validation.reward <= 1.0

    # stopped after step 2 and resumed from that checkpoint, steps 3-4 draw the same prompts and the
    # same completions as the uninterrupted run (trl's seeded sampler, the batches a resumed epoch
    # skips, the RNG states kept in the checkpoint), so their rewards are equal
    checkpoint = next(c.path for c in periodic if c.step == 2)
    resumed = run_in_process(config(tiny_base, tmp_path / "resumed", rows(4), rows(2)).model_copy(
                             update={"resume_from": checkpoint}), tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.last
    after = {p.step: p.reward for p in resumed.of(Progress)}
    assert sorted(after) == [3, 4]
    assert after == pytest.approx({p.step: p.reward for p in progress if p.step > 2}, abs=1e-6)


def test_rft_data_the_grader_cannot_read_is_refused_naming_lines(tiny_base, tmp_path):
    train = rows(3)
    train[1] = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "target": "yes"}
    del train[2]["target"]
    run = run_in_process(config(tiny_base, tmp_path, train), tmp_path)
    failed = run.of(Failed)[0]
    assert run.returncode == 1 and failed.code == "invalid_rft_data" and failed.error_class == "user"
    assert "line 2: the last message is 'assistant'" in failed.message
    assert "line 3: {{item.target}} is read by the grader" in failed.message
    assert not run.of(Started)



def test_grpo_trains_on_a_4bit_base_qlora_on_cpu(tiny_base, tmp_path):
    """QLoRA for reinforcement (`base_quantization: nf4`): bitsandbytes' NF4 layers run generation and the
    LoRA backward on CPU, so a CPU node trains it like a GPU node (no pool refuses it)."""
    cfg = config(tiny_base, tmp_path, rows(2), base_quantization="nf4", checkpoint_every_steps=100)
    run = run_in_process(cfg, tmp_path)
    assert run.returncode == 0, run.last
    progress = run.of(Progress)
    assert [p.step for p in progress] == [1, 2] and all(0.0 <= p.reward <= 1.0 for p in progress)
    final = Path(run.of(Checkpoint)[-1].path)
    summary = json.loads((final / "whetstone_training.json").read_text())
    assert summary["method"] == "reinforcement" and summary["quantization"]["quant_type"] == ["nf4"]
    assert summary["quantization"]["layers"] == 14   # every linear layer of the tiny Llama's blocks is 4-bit
    assert (final / "adapter_model.safetensors").is_file()
