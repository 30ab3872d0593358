"""The vision SFT recipe on the tiny LLaVA (CPU), driven as the agent drives a recipe (main.execute, in this
process: no interpreter start-up): image chats -> LoRA on the language model, loss falls, periodic and final
checkpoints (the processor and the image settings kept), packing off; a SIGTERM'd run resumed from its
emergency checkpoint equals the uninterrupted one bit for bit; a text-only base or another method refused."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from whetstone.devstack.recipe_harness import run_in_process, same_weights, write_jsonl
from whetstone.trainer_agent.domain.recipe_io import (
    Checkpoint,
    OomRetry,
    Started,
    TrainingConfig,
)
from whetstone.trainer_agent.recipes.faults import Faults

pytestmark = pytest.mark.integration

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30), "yellow": (230, 220, 40)}
HYPERPARAMETERS = {"n_epochs": 2, "learning_rate": 1e-2, "batch_size": 4, "gradient_accumulation_steps": 1,
                   "lora_r": 8, "lora_alpha": 16, "max_seq_len": 128, "seed": 3, "checkpoint_every_steps": 4,
                   "checkpoint_every_minutes": 0, "warmup_ratio": 0.0, "packing": True}
TOTAL_STEPS = 8  # 16 rows / 4 per step x 2 epochs


def image_chat(colour: str, i: int) -> dict:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (36 + i, 36), COLOURS[colour]).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "Which colour is this?"},
                                                      {"type": "image_url", "image_url": {"url": url}}]},
                         {"role": "assistant", "content": colour}]}


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    from whetstone.modelkit.tiny_vision import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("vlm") / "tiny-llava", seed=0)


@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    return {"train": write_jsonl([image_chat(c, i) for i in range(4) for c in COLOURS], root / "train.jsonl"),
            "validation": write_jsonl([image_chat(c, 5) for c in COLOURS], root / "validation.jsonl")}


def config(job_id: str, base: Path, files: dict[str, Path], out: Path, **overrides) -> TrainingConfig:
    return TrainingConfig(**{"job_id": job_id, "base_model": str(base), "train_file": files["train"],
                             "validation_file": files["validation"], "output_dir": out, "method": "lora",
                             "hyperparameters": dict(HYPERPARAMETERS), **overrides})


@pytest.fixture(scope="module")
def reference(tiny_llava, image_files, tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    return run_in_process(config("vision-ref", tiny_llava, image_files, root / "out"), root)


def test_vision_lora_learns_image_chats_and_checkpoints(reference):
    run = reference
    assert run.returncode == 0 and run.last.event == "completed", run.events[-1]
    assert run.names()[0] == "started" and run.of(Started)[0].total_steps == TOTAL_STEPS
    losses = run.losses()
    assert sorted(losses) == list(range(1, TOTAL_STEPS + 1))
    assert losses[TOTAL_STEPS] < 0.5 * losses[1], losses
    periodic = [e for e in run.of(Checkpoint) if e.kind == "periodic"]
    assert [e.step for e in periodic] == [4]   # the last step's is the final artifact
    first = Path(periodic[0].path)
    state = json.loads((first / "whetstone_state.json").read_text())
    assert state["kind"] == "periodic" and state["step"] == 4 and (first / "adapter_model.safetensors").is_file()
    assert run.completed.validation.loss < periodic[0].validation.loss
    assert run.completed.outcome.images == 16 and run.completed.validation.mean_token_accuracy > 0

    final = Path(run.of(Checkpoint)[-1].path)
    assert run.of(Checkpoint)[-1].kind == "final"
    assert (final / "processor_config.json").is_file() and (final / "tokenizer.json").is_file()
    summary = json.loads((final / "whetstone_training.json").read_text())
    assert summary["hyperparameters"]["packing"] is False   # asked for, but images are never packed
    vision = summary["vision"]
    assert vision["vision_tower"] == "frozen" and vision["tokens_per_image"] == 16 and vision["image_token"] == "<image>"
    assert vision["crop_size"] == {"height": 32, "width": 32} and vision["processor_class"] == "LlavaProcessor"

    from safetensors.torch import load_file

    trained = load_file(final / "adapter_model.safetensors")
    assert trained and all(".language_model." in name for name in trained)   # vision tower and projector frozen


def test_vision_resume_after_sigterm_equals_uninterrupted(reference, tiny_llava, image_files, tmp_path):
    base = config("vision-seg", tiny_llava, image_files, tmp_path / "seg0")
    first = run_in_process(base, tmp_path, faults=Faults(sigterm_after_forward=3))
    assert first.names()[-2:] == ["checkpoint", "preempted"], first.events[-3:]
    emergency = first.of(Checkpoint)[-1]
    assert emergency.kind == "emergency" and emergency.step == 3

    second = run_in_process(base.model_copy(update={"job_id": "vision-seg1", "output_dir": tmp_path / "seg1",
                                                    "resume_from": emergency.path}), tmp_path)
    assert second.last.event == "completed", second.events[-1]
    assert second.of(Started)[0].resumed_from_step == 3
    assert {**first.losses(), **second.losses()} == reference.losses()
    assert same_weights(Path(reference.of(Checkpoint)[-1].path), Path(second.of(Checkpoint)[-1].path))


def test_images_with_a_text_only_base_or_another_method_are_refused(tiny_base, tiny_llava, image_files, tmp_path):
    blind = run_in_process(config("vision-blind", tiny_base, image_files, tmp_path / "a"), tmp_path)
    assert blind.returncode == 1
    assert (blind.last.error_class, blind.last.code) == ("user", "model_cannot_see_images"), blind.last

    full = run_in_process(config("vision-full", tiny_llava, image_files, tmp_path / "b", method="full"), tmp_path)
    assert (full.last.code, full.returncode) == ("unsupported_method", 1) and "lora" in full.last.message


def test_lora_targets_language_model_unless_the_vision_tower_is_trained(tiny_llava):
    from whetstone.modelkit.vision import load_vision_model
    from whetstone.trainer_agent.recipes.errors import UserError
    from whetstone.trainer_agent.recipes.hyperparams import Hyperparameters
    from whetstone.trainer_agent.recipes.vision import vision_lora_config

    model = load_vision_model(tiny_llava)
    frozen = vision_lora_config(model, Hyperparameters.parse({"lora_r": 8}))
    assert "vision_tower" in frozen.exclude_modules and "fc1" not in frozen.target_modules
    tower = vision_lora_config(model, Hyperparameters.parse({"lora_r": 8, "train_vision_tower": True}))
    assert tower.exclude_modules is None and {"fc1", "linear_1", "q_proj"} <= set(tower.target_modules)
    with pytest.raises(UserError, match="no linear module named fc1"):
        vision_lora_config(model, Hyperparameters.parse({"lora_target_modules": ["fc1"]}))


def test_vision_out_of_memory_halves_the_micro_batch(tiny_llava, image_files, tmp_path):
    hp = {**HYPERPARAMETERS, "n_epochs": 1, "checkpoint_every_steps": 0}
    run = run_in_process(config("vision-oom", tiny_llava, image_files, tmp_path / "out", validation_file=None,
                                hyperparameters=hp), tmp_path, faults=Faults(oom_forwards=1))
    assert run.last.event == "completed", run.events[-1]
    retry = run.of(OomRetry)[0]
    assert (retry.micro_batch_size, retry.gradient_accumulation_steps) == (2, 2)
    assert (run.last.micro_batch_size, run.last.oom_retries, run.last.step) == (2, 1, 4)


def test_qlora_quantizes_the_language_model_only(tiny_llava):
    import bitsandbytes as bnb
    from whetstone.trainer_agent.recipes.modeling import (
        load_base_model,
        quantization_summary,
    )

    model = load_base_model(str(tiny_llava), "qlora", packing=False, vision=True)
    quantized = [name for name, module in model.named_modules() if isinstance(module, bnb.nn.Linear4bit)]
    assert len(quantized) == 14 and all(".language_model." in name for name in quantized)   # 2 layers x 7
    assert quantization_summary(model).quant_type == ["nf4"]
