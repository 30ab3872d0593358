"""Pure parts of the SFT recipe: config parsing, data validation, the event stream."""

from __future__ import annotations

import io
import json

import pytest
from whetstone.trainer_agent.domain.recipe_io import Completed, Progress, parse_event
from whetstone.trainer_agent.recipes.data import read_chat_jsonl
from whetstone.trainer_agent.recipes.errors import PlatformError, UserError
from whetstone.trainer_agent.recipes.hyperparams import Hyperparameters
from whetstone.trainer_agent.recipes.protocol import EventStream
from whetstone.trainer_agent.recipes.rows import ChatRow, PreferenceRow, parse_row
from whetstone.trainer_agent.recipes.spec import RecipeConfig

pytestmark = pytest.mark.unit


def test_hyperparameters_defaults_and_coercion():
    hp = Hyperparameters.parse({"n_epochs": 1.0, "warmup_ratio": 0, "unknown_knob": 3})
    assert hp.n_epochs == 1 and isinstance(hp.n_epochs, int)
    assert hp.warmup_ratio == 0.0 and isinstance(hp.warmup_ratio, float)
    assert hp.lora_r == 8 and hp.lora_alpha == 16 and hp.batch_size == 8 and hp.max_seq_len == 256


@pytest.mark.parametrize("raw", [{"lora_r": 0}, {"n_epochs": 1.5}, {"learning_rate": 1}, {"batch_size": "8"}, {"warmup_ratio": 1.0},
                                 {"lora_dropout": True}])
def test_invalid_hyperparameters_are_user_errors(raw):
    with pytest.raises(UserError):
        Hyperparameters.parse(raw)


def test_config_requires_platform_fields(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"job_id": "j", "base_model": "m"}))
    with pytest.raises(PlatformError, match="train_file, output_dir"):
        RecipeConfig.load(path)
    path.write_text(json.dumps({"job_id": "j", "base_model": "m", "train_file": "t", "output_dir": "o",
                                "method": "kto"}))
    with pytest.raises(UserError, match="unsupported method"):
        RecipeConfig.load(path)


def test_deepspeed_config_is_read_once_with_its_zero_stage(tmp_path, monkeypatch):
    from whetstone.trainer_agent.recipes.trainers import training_arguments

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    document = {"zero_optimization": {"stage": 2, "overlap_comm": True}, "train_batch_size": "auto"}
    (tmp_path / "ds.json").write_text(json.dumps(document))
    base = {"job_id": "j", "base_model": "m", "train_file": "t", "output_dir": "o"}
    config = tmp_path / "c.json"
    config.write_text(json.dumps({**base, "deepspeed": str(tmp_path / "ds.json")}))
    cfg = RecipeConfig.load(config)
    assert cfg.deepspeed is not None and cfg.deepspeed.document() == document and cfg.zero_stage == 2
    args = training_arguments(cfg.hyperparameters, output_dir=cfg.output_dir, deepspeed=cfg.deepspeed)
    assert args["deepspeed"] == document and "gradient_checkpointing" not in args   # trl's configs keep their own
    assert args["include_num_input_tokens_seen"] == "non_padding"
    assert training_arguments(cfg.hyperparameters, output_dir=cfg.output_dir, deepspeed=None,
                              count_input_tokens=False)["include_num_input_tokens_seen"] == "no"
    config.write_text(json.dumps({**base, "method": "qlora", "deepspeed": {"zero_optimization": {"stage": 3}}}))
    with pytest.raises(UserError, match="ZeRO-3"):   # inline, the same check
        RecipeConfig.load(config)
    config.write_text(json.dumps({**base, "deepspeed": {"zero_optimization": {"stage": "three"}}}))
    with pytest.raises(PlatformError, match="deepspeed.*zero_optimization.stage"):
        RecipeConfig.load(config)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": "three"}}))
    config.write_text(json.dumps({**base, "deepspeed": str(tmp_path / "ds.json")}))
    with pytest.raises(PlatformError, match="cannot read DeepSpeed config"):
        RecipeConfig.load(config)
    config.write_text(json.dumps({**base, "deepspeed": str(tmp_path / "missing.json")}))
    with pytest.raises(PlatformError, match="missing.json"):
        RecipeConfig.load(config)


def test_read_chat_jsonl_skips_blank_lines_and_names_bad_ones(tmp_path):
    good = '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}'
    path = tmp_path / "d.jsonl"
    path.write_text(good + "\n\n" + good + "\n")
    assert [line for line, _ in read_chat_jsonl(path)] == [1, 3]
    path.write_text(good + "\n" + '{"messages": [{"role": "assistant", "content": "a", "weight": 2}]}\n')
    with pytest.raises(UserError, match="d.jsonl line 2: message 0 has weight 2"):
        read_chat_jsonl(path)
    path.write_text("")
    with pytest.raises(UserError, match="has no rows"):
        read_chat_jsonl(path)


def test_rows_are_typed_but_reach_the_template_as_written():
    call = {"type": "function", "id": "c1", "function": {"arguments": '{"q": 1}', "name": "f"}}
    tool = {"function": {"parameters": {}, "name": "f"}, "type": "function"}
    row = {"tools": [tool], "messages": [{"content": "q", "role": "user", "x-note": [1]},
                                         {"role": "assistant", "content": None, "tool_calls": [call]},
                                         {"role": "tool", "tool_call_id": "c1", "content": "r", "weight": 0},
                                         {"role": "assistant", "content": "a"}]}
    chat = parse_row(ChatRow, row, "d.jsonl", 4)
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "assistant"]
    assert [m.trained for m in chat.messages] == [False, True, False, True]
    assert chat.messages[1].tool_calls[0].function.name == "f"
    # unknown keys and key order survive: a template that dumps tools or calls as JSON renders the same text
    assert json.dumps(chat.template_messages()) == json.dumps(row["messages"])
    assert json.dumps(chat.template_tools()) == json.dumps([tool])
    pair = parse_row(PreferenceRow, {"prompt": "q", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]},
                     "p.jsonl", 1).record()
    assert pair == {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
                    "rejected": [{"role": "assistant", "content": "b"}]}
    with pytest.raises(UserError, match=r"p.jsonl line 2: 'rejected' message 0 has role 'bot'") as caught:
        parse_row(PreferenceRow, {"prompt": "q", "chosen": "a", "rejected": [{"role": "bot", "content": "b"}]},
                  "p.jsonl", 2)
    assert caught.value.code == "bad_example"


def test_event_stream_writes_one_strict_json_object_per_line():
    buffer = io.StringIO()
    stream = EventStream(buffer, job_id="job-1")
    stream.emit(Progress(step=1, loss=float("nan"), grad_norm=float("inf")))
    stream.emit(Completed(step=2))
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["event"] == "progress" and first["job_id"] == "job-1"
    assert first["loss"] is None and first["grad_norm"] is None
    assert parse_event(lines[1]) == Completed(step=2, job_id="job-1", time=json.loads(lines[1])["time"])
