"""Every training method end to end on the tiny Llama (in process, CPU, a few steps each):
LoRA-family adapters load with PeftModel.from_pretrained, full/CPT weights load as a model,
checkpoints hold everything a resume needs, and bad input is refused before training."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
import torch
from peft import __version__ as peft_version
from whetstone.devstack.recipe_harness import (
    Conversation,
    preference_rows,
    run_in_process,
    text_rows,
    write_jsonl,
)
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    Progress,
    TrainingConfig,
)

pytestmark = pytest.mark.integration

HYPERPARAMETERS = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 128, "learning_rate": 1e-3, "seed": 0,
                   "checkpoint_every_steps": 3, "lora_dropout": 0.0}
CHECKPOINT_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "whetstone_state.json")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def method_data(tmp_path_factory, chat_demo) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("method-data")
    chat = chat_demo.generate_rows(24, seed=3)
    chats = [Conversation.model_validate(row) for row in chat]
    return {
        "chat": chat_demo.write_jsonl(chat, root / "chat.jsonl"),
        "preference": write_jsonl(preference_rows(chats), root / "preference.jsonl"),
        "text": write_jsonl(text_rows(chats), root / "text.jsonl"),
    }


DATA_FOR = {"lora": "chat", "qlora": "chat", "full": "chat", "dpo": "preference", "orpo": "preference",
            "cpt": "text"}


def config_for(method, base, data, out: Path, **hyperparameters) -> TrainingConfig:
    path = data[DATA_FOR[method]]
    return TrainingConfig(job_id=f"job-{method}", base_model=str(base), train_file=path, validation_file=path,
                          output_dir=out, method=method, hyperparameters={**HYPERPARAMETERS, **hyperparameters})


def assert_resumable_checkpoint(run, method):
    periodic = [c for c in run.of(Checkpoint) if c.kind == "periodic"]
    assert [c.step for c in periodic] == [3]
    path = Path(periodic[0].path)
    assert all((path / name).is_file() for name in CHECKPOINT_FILES)
    weights = "model.safetensors" if method in ("full", "cpt") else "adapter_model.safetensors"
    assert (path / weights).is_file()
    state = json.loads((path / "whetstone_state.json").read_text())
    assert state["kind"] == "periodic" and state["step"] == 3 and state["micro_batch_size"] == 4
    assert state["data_position"]["optimizer_steps_into_epoch"] == 3
    assert state["data_position"]["examples_into_epoch"] == 12
    assert periodic[0].validation.loss > 0  # validation at each checkpoint ...
    progress_3 = next(e for e in run.of(Progress) if e.step == 3)
    assert progress_3.validation.loss == periodic[0].validation.loss  # ... also in the progress event
    for event in run.of(Progress):
        assert event.peak_memory_mb > 0 and event.tokens_per_s > 0 and event.grad_norm is not None


@pytest.mark.parametrize("method", ["qlora", "full", "dpo", "orpo", "cpt"])
def test_method_trains_and_leaves_a_loadable_artifact(method, tiny_base, method_data, tmp_path):
    from transformers import AutoModelForCausalLM

    run = run_in_process(config_for(method, tiny_base, method_data, tmp_path / "out"), tmp_path)
    assert run.returncode == 0, run.last
    assert run.names()[0] == "started" and run.names()[-2:] == ["checkpoint", "completed"]
    assert run.completed.step == 6 and run.completed.validation.loss > 0 and run.completed.tokens > 0
    assert_resumable_checkpoint(run, method)
    final = Path(run.of(Checkpoint)[-1].path)
    for name in ("tokenizer.json", "chat_template.jinja", "whetstone_training.json"):
        assert (final / name).is_file(), name
    assert (final / "loss_curve.png").read_bytes()[:8] == PNG_MAGIC
    summary = json.loads((final / "whetstone_training.json").read_text())
    assert summary["method"] == method
    # the lockfile is the training process's own: every package it imports, at the version it ran
    lock = json.loads((final / "environment.lock.json").read_text())
    assert lock["source"] == "trainer" and lock["python"] == platform.python_version()
    assert lock["packages"]["torch"] == torch.__version__ and lock["packages"]["peft"] == peft_version
    assert lock["platform_commit"] and lock["commit_source"]   # this checkout's HEAD here
    if method == "qlora":  # 4-bit NF4 with double quantization, read back from the loaded layers
        assert summary["quantization"]["quant_type"] == ["nf4"] and summary["quantization"]["double_quant"] is True
        assert summary["quantization"]["layers"] == 14
    if method in ("full", "cpt"):
        trained = AutoModelForCausalLM.from_pretrained(final)
        base = AutoModelForCausalLM.from_pretrained(tiny_base)
        assert not torch.equal(trained.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight)
        assert not (final / "adapter_config.json").exists()
    else:
        from peft import PeftModel

        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base), final)
        targets = set(json.loads((final / "adapter_config.json").read_text())["target_modules"])
        assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
        assert any("lora_B" in name for name, _ in adapted.named_parameters())


def test_qlora_merged_model_matches_base_plus_adapter(tiny_base, method_data, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = config_for("qlora", tiny_base, method_data, tmp_path / "out", merge_adapter=True,
                        checkpoint_every_steps=0)
    run = run_in_process(config, tmp_path)
    assert run.returncode == 0, run.last
    final = Path(run.of(Checkpoint)[-1].path)
    merged = AutoModelForCausalLM.from_pretrained(final / "merged").eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base), final).eval()
    assert (final / "merged" / "chat_template.jinja").is_file()
    ids = torch.tensor([[1, 40, 41, 42, 43, 44]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


def test_batch_size_auto_reaches_the_target_effective_batch(tiny_base, method_data, tmp_path):
    config = config_for("lora", tiny_base, method_data, tmp_path / "out", batch_size="auto", target_effective_batch=8,
                        micro_batch_tokens=300, checkpoint_every_steps=0, n_epochs=1)
    run = run_in_process(config, tmp_path)
    assert run.returncode == 0, run.last
    started = run.events[0]
    assert started.micro_batch_size < 8  # the long examples do not fit 8 per micro-batch in 300 tokens
    assert started.micro_batch_size * started.gradient_accumulation_steps == 8
    assert run.last.step == 3  # 24 rows / effective batch 8


def test_dpo_reference_log_probs_are_computed_once_and_reused_on_resume(tiny_base, method_data, tmp_path):
    first = run_in_process(config_for("dpo", tiny_base, method_data, tmp_path / "a"), tmp_path)
    assert first.returncode == 0 and first.completed.outcome.ref_log_probs_s > 0
    checkpoint = next(c for c in first.of(Checkpoint) if c.kind == "periodic").path
    stored = json.loads((checkpoint / "ref_log_probs.json").read_text())
    assert len(stored["train"]["chosen"]) == 24 and len(stored["eval"]["rejected"]) == 24
    resumed = run_in_process(config_for("dpo", tiny_base, method_data, tmp_path / "b").model_copy(
                             update={"job_id": "job-dpo-2", "resume_from": checkpoint}), tmp_path)
    assert resumed.returncode == 0, resumed.last
    assert resumed.completed.outcome.ref_log_probs_s == 0.0  # reused from the checkpoint, not recomputed
    assert resumed.events[0].resumed_from_step == 3
    for step, loss in resumed.losses().items():
        assert loss == first.losses()[step], step


@pytest.mark.parametrize(("method", "data", "hyperparameters", "extra", "error_class", "code", "needle"), [
    ("dpo", "chat", {}, {}, "user", "method_dataset_mismatch", "method 'dpo' needs preference rows"),
    ("lora", "preference", {}, {}, "user", "method_dataset_mismatch", "fits method dpo or orpo"),
    ("lora", "chat", {"lora_target_modules": ["q_proj", "c_attn"]}, {}, "user", "invalid_hyperparameters",
     "no linear module named c_attn (available: down_proj, gate_proj"),
    ("lora", "chat", {"lora_r": 100}, {}, "user", "invalid_hyperparameters", "lora_r=100 exceeds"),
    ("lora", "chat", {"max_seq_len": 4096}, {}, "user", "invalid_hyperparameters", "context of 1024 tokens"),
    ("qlora", "chat", {}, {"deepspeed": {"zero_optimization": {"stage": 3}}}, "user", "qlora_zero3", "ZeRO-3"),
    ("kto", "chat", {}, {}, "user", "unsupported_method", "unsupported method 'kto'"),
])
def test_bad_input_is_refused_before_training(tiny_base, method_data, tmp_path, method, data, hyperparameters, extra,
                                              error_class, code, needle):
    # written as JSON by hand: an unknown method is no TrainingConfig
    config = tmp_path / "job-bad.config.json"
    config.write_text(json.dumps({"job_id": "job-bad", "base_model": str(tiny_base),
                                  "train_file": str(method_data[data]), "output_dir": str(tmp_path / "out"),
                                  "method": method, "hyperparameters": {**HYPERPARAMETERS, **hyperparameters},
                                  **extra}))
    run = run_in_process(config, tmp_path)
    assert run.returncode == 1
    assert run.names() == ["failed"]  # nothing started
    assert (run.last.error_class, run.last.code) == (error_class, code)
    assert needle in run.last.message, run.last.message


def test_unreadable_resume_checkpoint_is_a_platform_error(tiny_base, method_data, tmp_path):
    broken = tmp_path / "checkpoint-7"
    broken.mkdir()
    (broken / "trainer_state.json").write_text('{"global_step": 7, "log_hist')  # truncated upload
    config = config_for("lora", tiny_base, method_data, tmp_path / "out").model_copy(update={"resume_from": broken})
    run = run_in_process(config, tmp_path)
    assert run.returncode == 1 and run.names() == ["failed"]
    assert (run.last.error_class, run.last.code) == ("platform", "unreadable_checkpoint")
    assert "checkpoint-7" in run.last.message
