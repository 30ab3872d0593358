"""OpenAI tool-calling rows (as ingest normalises them) in the SFT recipe: validated with the
line named, rendered with the row's `tools` by the base model's own (tool-capable) template,
the tool calls trained and the tool results and user turns not; and a real run on them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from whetstone.devstack.recipe_harness import parse_line
from whetstone.modelkit.tiny import TOOL_CHAT_TEMPLATE
from whetstone.trainer_agent.domain.recipe_io import Completed, Progress, Started
from whetstone.trainer_agent.recipes.data import (
    IGNORE_INDEX,
    read_rows,
    tokenize_chat_rows,
)
from whetstone.trainer_agent.recipes.errors import UserError
from whetstone.trainer_agent.recipes.rows import ChatRow

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "find a capital",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def tool_row(i: int) -> dict:
    return {"tools": TOOLS, "messages": [
        {"role": "system", "content": "You answer with tools."},
        {"role": "user", "content": f"Capital of country {i}?", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": f"c{i}"})}}]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": f"city {i}"},
        {"role": "assistant", "content": f"It is city {i}.", "weight": 1},
    ]}


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tool_base(tiny_base, tmp_path_factory) -> Path:
    """The tiny Llama with a chat template that renders tools (same weights and vocabulary)."""
    base = tmp_path_factory.mktemp("tool-base") / "tiny-tools"
    shutil.copytree(tiny_base, base)
    (base / "chat_template.jinja").write_text(TOOL_CHAT_TEMPLATE)
    config = json.loads((base / "tokenizer_config.json").read_text())
    if "chat_template" in config:
        config["chat_template"] = TOOL_CHAT_TEMPLATE
        (base / "tokenizer_config.json").write_text(json.dumps(config))
    return base


def test_tool_rows_train_the_calls_and_the_answer_not_the_tool_results(tool_base, tmp_path):
    from whetstone.modelkit.loading import load_tokenizer

    tokenizer = load_tokenizer(str(tool_base))
    assert tokenizer.chat_template == TOOL_CHAT_TEMPLATE
    rows = read_rows(write_rows(tmp_path / "train.jsonl", [tool_row(7)]), "lora")
    (line, chat), = rows
    assert line == 1 and isinstance(chat, ChatRow) and chat.template_tools() == TOOLS
    example, = tokenize_chat_rows(tokenizer, rows, 512, "train.jsonl")
    trained = tokenizer.decode([t for t, label in zip(example.input_ids, example.labels) if label != IGNORE_INDEX])
    # the call (JSON-string arguments rendered as the object) and the answer; never the tool result or user
    assert trained == 'lookup{"q": "c7"}<|end|>It is city 7.<|end|>'
    rendered = tokenizer.decode(example.input_ids)
    assert '"name": "lookup"' in rendered and "city 7<|end|>" in rendered   # tools and the result were rendered
    assert "Capital of country 7?" not in trained and "city 7<|end|>" not in trained.replace("It is city 7", "")


@pytest.mark.parametrize(("bad", "needle"), [
    ({"role": "user", "content": "q", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
     "only assistant turns call tools"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
     "tool_calls[0] arguments are not valid JSON"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
     "tool_calls[0] needs a function with a 'name'"),
    ({"role": "assistant", "content": None}, "message 1 has no string 'content'"),
    ({"role": "tool", "content": "r", "tool_call_id": 3}, "non-string 'tool_call_id'"),
    ({"role": "robot", "content": "r"}, "has role 'robot'"),
])
def test_malformed_tool_messages_are_named(tmp_path, bad, needle):
    row = {"messages": [{"role": "user", "content": "q"}, bad, {"role": "assistant", "content": "a"}]}
    path = write_rows(tmp_path / "d.jsonl", [tool_row(0), row])
    with pytest.raises(UserError, match="d.jsonl line 2") as caught:
        read_rows(path, "lora")
    assert needle in str(caught.value) and caught.value.code == "bad_example"


def test_bad_tools_list_is_named(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [{**tool_row(0), "tools": [{"type": "function", "function": {}}]}])
    with pytest.raises(UserError, match=r"d.jsonl line 1: tools\[0\] has no function 'name'"):
        read_rows(path, "lora")


def test_preference_messages_keep_their_extra_keys(tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    row = {"prompt": [{"role": "user", "content": "q", "name": "bob"}],
           "chosen": [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c1", "content": "r"},
                      {"role": "assistant", "content": "good", "weight": 1}],
           "rejected": "bad"}
    (_, row_read), = read_rows(write_rows(tmp_path / "p.jsonl", [row]), "dpo")
    pair = row_read.record()   # what trl is given
    assert pair["prompt"] == [{"role": "user", "content": "q", "name": "bob"}]
    assert pair["chosen"][0]["tool_calls"] == [call] and pair["chosen"][1]["tool_call_id"] == "c1"
    assert pair["chosen"][2]["weight"] == 1 and pair["rejected"] == [{"role": "assistant", "content": "bad"}]


def test_sft_trains_on_tool_rows(tool_base, tmp_path):
    """A couple of real LoRA steps on tool rows (train and validation), as the trainer agent runs it."""
    train = write_rows(tmp_path / "train.jsonl", [tool_row(i) for i in range(4)])
    holdout = write_rows(tmp_path / "holdout.jsonl", [tool_row(i) for i in range(10, 12)])
    config = {"job_id": "job-tools", "base_model": str(tool_base), "train_file": str(train),
              "validation_file": str(holdout), "output_dir": str(tmp_path / "out"), "method": "lora",
              "hyperparameters": {"n_epochs": 1, "batch_size": 2, "gradient_accumulation_steps": 1,
                                  "max_seq_len": 256, "learning_rate": 1e-2, "seed": 0,
                                  "checkpoint_every_steps": 1000}}
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "whetstone.trainer_agent.recipes.main", "--config", str(config_path)],
                          capture_output=True, text=True, env=env, timeout=400, check=False)
    events = [parse_line(line) for line in proc.stdout.splitlines() if line.strip()]
    names = [e.event for e in events]
    assert proc.returncode == 0 and "failed" not in names, (events[-1:], proc.stderr[-3000:])
    assert isinstance(events[0], Started) and events[0].total_steps == 2 and isinstance(events[-1], Completed)
    assert [e.step for e in events if isinstance(e, Progress)] == [1, 2]
    assert events[-1].validation is not None and isinstance(events[-1].validation.loss, float)
