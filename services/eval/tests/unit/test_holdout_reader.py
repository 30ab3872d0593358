"""The validation file eval reads is the split ingest wrote: its chat and preference schemas."""

import json

import pytest
from whetstone.eval.adapters.holdout import HoldoutError, read_holdout
from whetstone.eval.domain.rows import Turn

pytestmark = pytest.mark.unit


def _file(tmp_path, rows):
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ingest_preference_rows_score_the_chosen_answer(tmp_path):
    row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
           "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}
    [r] = read_holdout(_file(tmp_path, [row]), 10)
    prompt = [Turn("system", "Be brief."), Turn("user", "2 + 2?")]
    assert r.reference == "4" and r.prompt == prompt and r.messages == [*prompt, Turn("assistant", "4")]


@pytest.mark.parametrize("row,expect", [
    ({"prompt": [], "chosen": [{"role": "assistant", "content": "4"}]}, "line 1: 'prompt' must be a list"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant"}]}, "chosen[0] needs string"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "a"}]},
     "last message must be the assistant"),
    ({"chosen": "4", "rejected": "5"}, "expected 'messages' (chat) or 'prompt' + 'chosen'"),
])
def test_bad_preference_rows_name_the_line_and_field(tmp_path, row, expect):
    with pytest.raises(HoldoutError) as err:
        read_holdout(_file(tmp_path, [row]), 10)
    assert expect in str(err.value)
